"""ampc.cpu: torch.cpu's AMP name (ampc.cpu.amp.autocast, deprecated)."""

from ampc.cpu import amp

__all__ = ["amp"]
