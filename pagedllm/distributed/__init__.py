"""Beyond one process: tensor parallelism (TP), data-parallel replicas (DP), Ray placement.

    parallel_state.py  the TP process group (torch.distributed: gloo on CPU, NCCL on CUDA)
    sharding.py        which rows / columns / heads / vocab range each rank holds; the
                       collectives that complete a sharded layer (Linear/VocabEmbedding hooks)
    step_message.py    the compact per-step message rank 0 sends to the other ranks
    worker.py          a TP rank > 0: model shard + KV shard, mirrors each step (no sampling)
    executor.py        rank 0's handle on the other ranks; mp_executor.py / ray_executor.py
    dp/                data parallelism: replica processes behind one API server, routing
"""

from pagedllm.distributed.errors import WorkerDied

__all__ = ["WorkerDied"]
