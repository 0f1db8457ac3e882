"""Many machines: engines on Ray actors, one per GPU, behind one client (needs Ray).

``await start_ray_pool(ops=...)`` after ``ray.init()`` starts a Ray actor per GPU
of the cluster, each hosting an engine, and returns them as an EngineGroup: the
same typed messages, arrays by value (NumPy) or as RemoteArrays that stay on their
GPU. See docs/scaling.md.
"""

from __future__ import annotations

try:
    import ray as _ray  # noqa: F401  (Ray is an optional extra)
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("gpuactors.ray needs Ray: pip install 'gpuactors[ray]'") from exc

from gpuactors.ray.host import EngineHost, HostSpec, Outcome
from gpuactors.ray.member import RayMember
from gpuactors.ray.pool import start_ray_pool

__all__ = ["EngineHost", "HostSpec", "Outcome", "RayMember", "start_ray_pool"]
