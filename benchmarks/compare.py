"""The relative error the GPU scripts print: ||x - ref|| / ||ref|| in float64 (Frobenius norms), inf where x is not
finite. Import as `from compare import rel` (a script's own folder is first on sys.path)."""
import torch


def rel(x, ref):
    x, ref = x.detach().double(), ref.detach().double()
    if not torch.isfinite(x).all():
        return float("inf")
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()
