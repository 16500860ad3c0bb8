"""The chat page at `/` (like llama-server's web UI): static HTML/JS/CSS shipped in the
package (entrypoints/static/), no build step and nothing loaded from another site.

The page talks to the same OpenAI endpoints as any client: /v1/models for the model picker,
streaming /v1/chat/completions for answers (its Stop button closes the stream, which aborts
the request in the engine), and it asks for the key when the server has --api-key.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from starlette.responses import FileResponse
from starlette.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).with_name("static")


def add_chat_page(app: FastAPI) -> None:
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/", include_in_schema=False)
    async def chat_page() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    # Browsers ask for /favicon.ico whatever the page says: an SVG icon (they accept it by
    # its media type), so the log shows no 404 for every page load.
    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> FileResponse:
        return FileResponse(STATIC_DIR / "favicon.svg", media_type="image/svg+xml",
                            headers={"Cache-Control": "max-age=86400"})
