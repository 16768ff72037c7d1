"""ampc.GradScaler as a drop-in for torch.amp.GradScaler in torch's own AMP recipe, then its fused
unscale + clip (one pass over the gradients instead of unscale_ and clip_grad_norm_). Needs a CUDA GPU.

    python examples/torch_gradscaler.py
"""

import torch

import ampc


def main(steps: int = 100, seed: int = 0) -> float:
    """Fit a small regression in float16 autocast; return the final loss."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 1)).cuda()
    target = torch.nn.Linear(256, 1).cuda().requires_grad_(False)  # the function to learn
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    scaler = ampc.GradScaler("cuda")  # was: torch.amp.GradScaler("cuda")
    for step in range(steps):
        x = torch.randn(128, 256, device="cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.mse_loss(model(x), target(x))
        opt.zero_grad()
        scaler.scale(loss).backward()
        norm = scaler.unscale_(opt, max_norm=1.0)  # unscale, check and clip in one pass; the norm stays on the GPU
        scaler.step(opt)
        scaler.update()
        if step % 25 == 0:
            print(f"step {step:3d}  loss {loss.item():.4f}  grad norm {float(norm):.3f}  "
                  f"scale {scaler.get_scale():.0f}")
    print(f"final loss {loss.item():.4f}")
    return loss.item()


if __name__ == "__main__":
    main()
