"""Train N nodes' copies of one architecture at once, as one stacked model.

A simulation runs N virtual nodes in one process.
:class:`~dacflnode.sim.batched.trainer.BatchedTrainer` converts the model, layer by layer, into
one stacked model that holds all N nodes' weights and runs all N nodes' mini-batches through one
set of kernels (:mod:`~dacflnode.sim.batched.layers`):

* ``Conv2d(cin, cout, groups=g)`` becomes ``Conv2d(N*cin, N*cout, groups=N*g)`` on
  channel-packed activations ``[B, N*C, H, W]`` (node-major: node ``n`` owns channels
  ``n*C .. n*C+C-1``), so every node convolves only its own channels with its own filters;
* ``BatchNorm2d(C)`` becomes ``BatchNorm2d(N*C)``: statistics are per channel, hence per node;
* ``ReLU`` and other element-wise activations, ``MaxPool2d`` and ``AvgPool2d`` act per channel
  and are used unchanged;
* ``Flatten`` turns ``[B, N*C, H, W]`` into ``[N, B, C*H*W]``;
* ``Linear`` keeps per-node weights ``[N, out, in]`` and runs as one batched matrix product.

Every stacked tensor viewed as ``[N, *original_shape]`` holds the N nodes' copies of one
``state_dict`` entry, so loading and extracting ``[N, P]`` flat vectors (see
:class:`~dacflnode.learning.layout.StateLayout`) is plain slicing.

The loss is the sum over nodes of each node's mean cross-entropy. No node's loss depends on
another node's weights, so the gradient with respect to node ``n``'s weights is exactly node
``n``'s own gradient, and one SGD optimizer over the stacked parameters (element-wise updates with
the same lr, momentum and weight decay) performs exactly the N separate SGD updates. Every node
follows the same :func:`~dacflnode.learning.train.batch_plan` as a
:class:`~dacflnode.learning.train.LocalTrainer` with the same ``node_index``, so both engines
see the same mini-batches and agree up to float32 rounding (which, as between any two float32
implementations, training can amplify: batch norm over small batches is ill-conditioned).

The modules, by concern:

* :mod:`~dacflnode.sim.batched.layers`: which models can be stacked, and the stacked layers;
* :mod:`~dacflnode.sim.batched.trainer`: :class:`~dacflnode.sim.batched.trainer.BatchedTrainer`,
  its nodes split into groups, each one stacked model;
* :mod:`~dacflnode.sim.batched.threads`: where the nodes are cut into groups, and the groups run
  on one thread each;
* :mod:`~dacflnode.sim.batched.memory`: the C library's allocator told to keep freed memory.

Where the speed comes from, on a CPU, and what bf16 changes: measured in
``benchmarks/RESULTS.md`` ("The batched engine: where its speed comes from").
"""
