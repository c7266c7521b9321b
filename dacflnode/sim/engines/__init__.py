"""How a simulation trains and evaluates its N virtual nodes: one
:class:`~dacflnode.protocol.training.NodeTrainer` per runner, behind one of two engines.

``sequential`` gives each runner its own :class:`~dacflnode.learning.train.LocalTrainer`, run by a
:class:`~dacflnode.protocol.training.ThreadedTrainer` on the event loop's thread
(:class:`~dacflnode.sim.engines.base.InlineExecutor`): one training at a time, the exact training
code of a daemon, so its results match a deployment bit for bit. ``batched`` gives each runner a
handle on one shared :class:`~dacflnode.sim.batched.trainer.BatchedTrainer`: the handles gather
the runners' calls of a round (:class:`~dacflnode.sim.gather.RoundGather`) and train, or
evaluate, all nodes at once as one stacked model — mathematically identical, equal to float32
rounding, and several times faster for small models. ``auto`` picks ``batched`` when the model
and the partition allow it (a built-in model, equal partition sizes).

With a :class:`~dacflnode.sim.engines.base.RayTarget` (``simulate --ray``) either engine runs on
the workers of a Ray cluster instead (:mod:`dacflnode.sim.engines.ray`, the only module that
imports Ray): each worker owns a contiguous slice of the nodes, and the results equal the local
engine's bit for bit (see there).

The modules: :mod:`~dacflnode.sim.engines.base` (what every engine is, and the base of the
engines that gather a round's calls), :mod:`~dacflnode.sim.engines.local` (the two engines of
this process), :mod:`~dacflnode.sim.engines.ray` (both on Ray) and
:mod:`~dacflnode.sim.engines.registry` (:func:`~dacflnode.sim.engines.registry.make_engine`,
which registers the Ray engines only where Ray is installed).
"""
