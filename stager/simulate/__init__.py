"""``stager simulate``: a whole job in simulated time, at any number of nodes.

The simulator runs stager's own plan, rank split, cache and policies, and
peer ownership (``demand``: what each node reads at each step, and from
where, exactly) and models only what it cannot run (``profile``: the shared
file system, the nodes' cores and storage, the network, the costs per file),
in a discrete-event simulation built on SimPy (``des``). ``run`` compares
methods of reading; ``report`` prints and plots them.

May import: the engine and the rooms below it, and ``model`` (the cache replay).
"""

from .demand import Demand, NodeDemand, node_demand
from .profile import Profile, load_profile, profile_from_dict
from .run import METHODS, Layout, capacity_bytes, simulate

__all__ = ["Demand", "Layout", "METHODS", "NodeDemand", "Profile", "capacity_bytes", "load_profile", "node_demand",
           "profile_from_dict", "simulate"]
