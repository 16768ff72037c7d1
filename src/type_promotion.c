/*
 * type_promotion.c: the dtype torch gives an elementwise op's result
 * (ATen's ResultTypeState, c10's promoteTypes), over the three kinds of
 * operand torch tells apart:
 *   - arrays with dimensions promote among themselves;
 *   - 0-d arrays among themselves, and count only where their category
 *     (bool < integer < floating) is above the arrays': float16 times a 0-d
 *     float32 array is float16, an int64 array plus a 0-d float64 one float64;
 *   - Python numbers likewise below both, a float as torch's default dtype
 *     (float32): float16 + 2.5 is float16, an integer array + 2.5 float32.
 * ampc's elementwise kernels compute floating results only, so among
 * integers only the category matters here; the integer dtypes' own
 * promotion (int8 with uint8 is int16 ...) would decide an integer result,
 * which the caller refuses or replaces.
 */
#include "op_args.h"

ampc_dtype ampc_promote_float(ampc_dtype x, ampc_dtype y)
{
    if (x == y)
        return x;
    if (x == AMPC_FLOAT64 || y == AMPC_FLOAT64)
        return AMPC_FLOAT64;
    return AMPC_FLOAT32;  /* float32 with a 16-bit type, or float16 with bfloat16 */
}

static ampc_type_category category_of(ampc_dtype d)
{
    return AMPC_DTYPE_IS_FLOAT(d) ? AMPC_CATEGORY_FLOAT : d == AMPC_BOOL ? AMPC_CATEGORY_BOOL
                                                                          : AMPC_CATEGORY_INTEGER;
}

static void add_to(ampc_type_group *g, ampc_type_category category, ampc_dtype d)
{
    if (category == AMPC_CATEGORY_FLOAT)
        g->floating = g->category == AMPC_CATEGORY_FLOAT ? ampc_promote_float(g->floating, d) : d;
    if (category > g->category)
        g->category = category;
}

void ampc_promotion_init(ampc_promotion *r)
{
    const ampc_type_group none = {AMPC_CATEGORY_NONE, AMPC_FLOAT32};
    r->dims = r->zero_dim = r->numbers = none;
}

void ampc_promotion_add_array(ampc_promotion *r, const ampc_view *v)
{
    add_to(v->ndim > 0 ? &r->dims : &r->zero_dim, category_of(v->dtype), v->dtype);
}

void ampc_promotion_add_number(ampc_promotion *r, ampc_type_category category)
{
    add_to(&r->numbers, category, AMPC_FLOAT32);  /* torch's default dtype */
}

/* torch's combine_categories: the higher group's type, unless the lower one
 * is of a higher category (floating against integers, anything against bool). */
static ampc_type_group combine(ampc_type_group higher, ampc_type_group lower)
{
    if (higher.category == AMPC_CATEGORY_FLOAT)
        return higher;
    if (lower.category == AMPC_CATEGORY_FLOAT)
        return lower;
    return lower.category > higher.category ? lower : higher;
}

ampc_type_group ampc_promotion_result(const ampc_promotion *r)
{
    return combine(r->dims, combine(r->zero_dim, r->numbers));
}
