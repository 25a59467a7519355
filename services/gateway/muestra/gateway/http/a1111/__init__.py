"""AUTOMATIC1111's web-UI API (/sdapi/v1/*) on the gateway's HTTP port, over the same GenerateImage.

Field names and response shapes are A1111's (modules/api/models.py, modules/processing.py); unknown fields
are ignored as A1111 ignores them, but an A1111 feature muestra does not have (hires fix, face restoration,
scripts, ...) is refused when it is switched on. Width, height, steps and cfg_scale default to the model's; a
size over the model's limit is generated at the model's own size and resized (sizes.py). Every error under
/sdapi is A1111's: {"detail": message} with a 4xx status (404 and 405 for routes it does not have), and 422
with FastAPI's list for a body that does not validate. /progress and /interrupt see the A1111 jobs of this
gateway process.

schemas.py: the request bodies and the error; convert.py: a body as an ImageRequest, a result as A1111's
`info`; sizes.py: the size generated and the resize; routes.py: generation, the jobs /progress reports, and
the model and sampler listings; listings.py: the other listings clients read (most of them empty), png-info
and the no-op refreshes; extras.py: the Extras tab's model-free upscalers; infotext.py: A1111's sampler names
in the infotext.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.routing import Match

from muestra.gateway.http.a1111 import extras, listings, routes
from muestra.gateway.http.a1111.routes import Jobs, a1111_error
from muestra.gateway.http.a1111.schemas import A1111Error

__all__ = ["A1111Error", "Jobs", "a1111_error", "router"]

router = APIRouter()
router.include_router(routes.router)
router.include_router(listings.router)
router.include_router(extras.router)
ANY_METHOD = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


@router.api_route("/sdapi/{path:path}", methods=ANY_METHOD, include_in_schema=False)
async def not_served(http: Request) -> None:
    """A1111's 404 and 405 for the rest of /sdapi (the app's own answers to these are in OpenAI's shape)."""
    allowed = set()
    for route in (*routes.router.routes, *listings.router.routes, *extras.router.routes):
        if route.matches(http.scope)[0] == Match.PARTIAL:
            allowed |= route.methods
    if allowed:
        raise A1111Error(405, "Method Not Allowed", headers={"Allow": ", ".join(sorted(allowed))})
    raise A1111Error(404, "Not Found")
