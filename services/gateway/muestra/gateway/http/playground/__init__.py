"""The web playground: static files shipped in this package, served at / on the gateway's HTTP port.

The page talks to the gateway only through the public HTTP API (/v1/...), so everything it does can be
done with curl. Its own files are the only thing served without an API key. POST /tokenize (vLLM's route
and shape, behind the key) is here for the chat, which counts its history's tokens to fit the context.
"""

from __future__ import annotations

import hashlib
import mimetypes
from importlib import resources

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict

from muestra.gateway.engine import requests
from muestra.gateway.http.errors import from_muestra
from muestra.runtime.errors import MuestraError

STATIC = resources.files(__package__) / "static"
PREFIX = "/ui/"
TYPES = {".js": "text/javascript", ".css": "text/css", ".html": "text/html", ".svg": "image/svg+xml"}
# The page loads nothing from elsewhere; images it shows are data: URLs made from the API's base64.
POLICY = (
    "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)


def load_files(folder=STATIC, prefix: str = "") -> dict[str, tuple[bytes, str, str]]:
    """name -> (body, content type, ETag) of every file in static/ (vendor/x.js for the vendored libraries);
    create_app reads them once, at start-up, so only these names are ever served."""
    files = {}
    for entry in folder.iterdir():
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            files.update(load_files(entry, f"{prefix}{entry.name}/"))
        elif entry.is_file():
            body = entry.read_bytes()
            suffix = "." + entry.name.rsplit(".", 1)[-1]
            kind = TYPES.get(suffix) or mimetypes.guess_type(entry.name)[0] or "application/octet-stream"
            if kind.startswith("text/") or kind.endswith("+xml"):
                kind += "; charset=utf-8"
            files[prefix + entry.name] = (body, kind, '"' + hashlib.blake2b(body, digest_size=8).hexdigest() + '"')
    return files


def is_open_path(path: str) -> bool:
    """The page and its files: served without an API key (they hold no data)."""
    return path == "/" or path.startswith(PREFIX)


router = APIRouter(include_in_schema=False)


def _serve(name: str, request: Request) -> Response:
    found = request.app.state.playground_files.get(name)
    if found is None:
        return Response(f"no such file: {name}\n", status_code=404, media_type="text/plain")
    body, kind, etag = found
    headers = {
        "ETag": etag,
        "Cache-Control": "no-cache",
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": POLICY,
        "Referrer-Policy": "no-referrer",
    }
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    return Response(body, media_type=kind, headers=headers)


@router.get("/")
async def index(request: Request) -> Response:
    return _serve("index.html", request)


@router.get(PREFIX + "{name:path}")
async def static_file(name: str, request: Request) -> Response:
    return _serve(name, request)


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: str
    content: str


class TokenizeBody(BaseModel):
    """vLLM's /tokenize: a prompt, or messages rendered with the chat template as a chat completion's are."""

    model_config = ConfigDict(extra="forbid")
    model: str = ""
    prompt: str | None = None
    messages: list[Message] | None = None
    add_special_tokens: bool = True


@router.post("/tokenize")
async def tokenize(body: TokenizeBody, http: Request) -> dict:
    messages = prompt = None
    if body.messages is not None:
        messages = [requests.Message(role=m.role, content=m.content) for m in body.messages]
    elif body.prompt is not None:
        prompt = body.prompt
    try:
        encoding, model = await http.app.state.engine.tokenize(body.model, prompt, messages, body.add_special_tokens)
    except MuestraError as exc:
        raise from_muestra(exc) from None
    return {"count": len(encoding.ids), "max_model_len": model.context_length, "tokens": list(encoding.ids)}
