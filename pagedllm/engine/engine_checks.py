"""The health and consistency checks of an engine, apart from its step loop: the server polls
`check_health` and runs `check_idle` whenever it idles; tests call `check_invariants` after
every operation. Mixed into `LLMEngine`, whose parts (engine_builder.EngineParts) they read.
"""

from __future__ import annotations

from pagedllm.core.block_invariants import BlockInvariantError


class EngineChecks:
    """check_health / shutdown / check_idle / check_invariants of an LLMEngine."""

    def check_health(self) -> None:
        """Raise WorkerDied if a tensor-parallel worker is gone (the server polls it)."""
        if self.executor is not None:
            self.executor.check_health()

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers (nothing to do for one process)."""
        if self.executor is not None:
            self.executor.shutdown()

    def check_idle(self) -> None:
        """With no request left: block accounting intact and no KV block in use (raises
        BlockInvariantError otherwise); the server runs it whenever it idles."""
        self.check_invariants()
        if self.block_manager.usage != 0:
            raise BlockInvariantError(f"idle engine holds KV blocks (usage "
                                      f"{self.block_manager.usage:.3f})")

    def check_invariants(self) -> None:
        """The block manager's and the swap pool's invariants over the live sequences."""
        live = self.output_processor.sequences()
        self.block_manager.check_invariants(live)
        if self.swap_manager is not None:
            self.swap_manager.check_invariants(live)
