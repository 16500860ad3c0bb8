"""POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's routes and bodies)."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.responses import PlainTextResponse

from pagedllm.entrypoints.openapi_spec import POST_ERRORS
from pagedllm.entrypoints.protocol import OpenAIBaseModel
from pagedllm.entrypoints.serving import APIError
from pagedllm.entrypoints.serving_models import ServingModels
from pagedllm.errors import ModelNotFoundError


class LoadLoRAAdapterRequest(OpenAIBaseModel):
    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(OpenAIBaseModel):
    lora_name: str
    lora_int_id: int | None = None


def add_lora_routes(app: FastAPI, models: ServingModels) -> None:
    def check_allowed() -> None:
        why = models.runtime_updates_refused()
        if why is not None:
            raise APIError(404, why, type="not_found_error")

    @app.post("/v1/load_lora_adapter", responses=POST_ERRORS)
    async def load_lora_adapter(body: LoadLoRAAdapterRequest) -> PlainTextResponse:
        check_allowed()
        if not body.lora_name or not body.lora_path:
            raise APIError(400, "both lora_name and lora_path are required", param="lora_name")
        try:
            await models.load(body.lora_name, body.lora_path)
        except ValueError as exc:
            raise APIError(400, f"loading LoRA adapter {body.lora_name!r} failed: {exc}",
                           param="lora_path") from exc
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter", responses=POST_ERRORS)
    async def unload_lora_adapter(body: UnloadLoRAAdapterRequest) -> PlainTextResponse:
        check_allowed()
        try:
            models.unload(body.lora_name)
        except ModelNotFoundError:
            raise APIError(404, f"the LoRA adapter {body.lora_name!r} is not loaded",
                           type="not_found_error", param="lora_name",
                           code="model_not_found") from None
        return PlainTextResponse(
            f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
