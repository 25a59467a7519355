"""AUTOMATIC1111's web-UI API (/sdapi/v1/*) on the gateway's HTTP port, over the same GenerateImage.

Field names and response shapes are A1111's (modules/api/models.py, modules/processing.py); unknown fields
are ignored as A1111 ignores them, but an A1111 feature muestra does not have (hires fix, face restoration,
scripts, ...) is refused when it is switched on. Width, height, steps and cfg_scale default to the model's.
Errors are A1111's: {"detail": message} with a 4xx status, and 422 with FastAPI's list for a body that does
not validate. /progress and /interrupt see the A1111 jobs of this gateway process.

schemas.py: the request bodies and the error; convert.py: a body as an ImageRequest, a result as A1111's
`info`; routes.py: the routes and the jobs /progress reports.
"""

from __future__ import annotations

from muestra.gateway.a1111.routes import Jobs, a1111_error, router
from muestra.gateway.a1111.schemas import A1111Error

__all__ = ["A1111Error", "Jobs", "a1111_error", "router"]
