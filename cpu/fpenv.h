/*
 * fpenv.h: run CPU kernels under the default floating-point environment.
 *
 * Another library may have left flush-to-zero, denormals-are-zero or another
 * rounding mode in the caller's MXCSR (or a thread may inherit it); the
 * kernels set the default for their own work (all exceptions masked, round
 * to nearest even, no FTZ/DAZ) and restore the caller's afterwards, exception
 * flags included.
 */
#ifndef AMPC_FPENV_H
#define AMPC_FPENV_H

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define AMPC_FPENV_ENTER() const unsigned ampc_saved_mxcsr_ = _mm_getcsr(); _mm_setcsr(0x1f80u)
#define AMPC_FPENV_LEAVE() _mm_setcsr(ampc_saved_mxcsr_)
#else
/* Elsewhere only the portable kernels run; they assume the default environment. */
#define AMPC_FPENV_ENTER() (void)0
#define AMPC_FPENV_LEAVE() (void)0
#endif

#endif /* AMPC_FPENV_H */
