"""A1111's request bodies (the fields muestra reads, and those it can only leave off) and its error."""

from __future__ import annotations

import json
from typing import Any, Literal

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from muestra.gateway.http.errors import OpenAIError

UINT32_MAX = 2**32 - 1


class A1111Error(Exception):
    """An error response in A1111's shape: {"detail": detail} with `status`."""

    def __init__(self, status: int, detail: Any, headers: dict[str, str] | None = None) -> None:
        super().__init__(str(detail))
        self.status = status
        self.detail = detail
        self.headers = headers


class Txt2ImgRequest(BaseModel):
    """StableDiffusionTxt2ImgProcessingAPI: the fields muestra reads, and those it can only leave off."""

    model_config = ConfigDict(extra="ignore")

    prompt: str = ""
    negative_prompt: str = ""
    seed: int = Field(-1, ge=-1, le=2**64 - 1)
    sampler_name: str | None = None
    sampler_index: str | None = None
    scheduler: str | None = None
    batch_size: int = Field(1, ge=1, le=UINT32_MAX)
    n_iter: int = Field(1, ge=1, le=UINT32_MAX)
    steps: int | None = Field(None, ge=1, le=UINT32_MAX)
    cfg_scale: float | None = None
    width: int | None = Field(None, ge=0, le=UINT32_MAX)
    height: int | None = Field(None, ge=0, le=UINT32_MAX)
    override_settings: dict[str, Any] | None = None
    # Features muestra does not have: accepted only when off.
    enable_hr: bool = False
    restore_faces: bool | None = None
    tiling: bool | None = None
    subseed_strength: float = 0.0
    styles: list[str] | None = None
    script_name: str | None = None
    alwayson_scripts: dict[str, Any] | None = None
    send_images: bool = True


class Img2ImgRequest(Txt2ImgRequest):
    """StableDiffusionImg2ImgProcessingAPI."""

    init_images: list[str] = Field(min_length=1)
    resize_mode: int = 0
    denoising_strength: float = 0.75
    mask: str | None = None
    mask_blur: int | None = Field(None, ge=0, le=UINT32_MAX)
    mask_blur_x: int = Field(4, ge=0, le=UINT32_MAX)
    mask_blur_y: int = Field(4, ge=0, le=UINT32_MAX)
    inpainting_mask_invert: int = Field(0, ge=0, le=1)
    inpaint_full_res: bool = True
    inpaint_full_res_padding: int = Field(0, ge=0, le=UINT32_MAX)
    # diffusers' inpainting starts from the original image under the mask; A1111's other fills have no
    # counterpart, and its default (0, "fill") is accepted as that.
    inpainting_fill: int = 0
    include_init_images: bool = False


class PngInfoRequest(BaseModel):
    image: str


OFF_FEATURES = (
    ("enable_hr", "hires fix"),
    ("restore_faces", "face restoration"),
    ("tiling", "tiling"),
    ("subseed_strength", "variation seeds"),
    ("styles", "styles"),
    ("script_name", "scripts"),
    ("alwayson_scripts", "scripts"),
)


def _validation_detail(exc: ValidationError) -> list[dict]:
    return [{"loc": ["body", *e["loc"]], "msg": e["msg"], "type": e["type"]} for e in exc.errors()]


async def read_body(http: Request, model: Any) -> Any:
    """The JSON body as `model`; A1111's 422 with FastAPI's list of errors when it does not validate."""
    try:
        raw = await http.body()
    except OpenAIError as exc:  # the Edge's limit on the body, met while it is read
        raise A1111Error(exc.status, exc.message) from None
    try:
        data = json.loads(raw or b"null")
    except ValueError as exc:
        raise A1111Error(422, [{"loc": ["body"], "msg": f"JSON decode error: {exc}", "type": "json_invalid"}]) from None
    try:
        return TypeAdapter(model).validate_python(data)
    except ValidationError as exc:
        raise A1111Error(422, _validation_detail(exc)) from None


class ExtrasRequest(BaseModel):
    """ExtrasBaseRequest: the Extras tab's upscale (face restoration is accepted only when off)."""

    model_config = ConfigDict(extra="ignore")

    resize_mode: Literal[0, 1] = 0
    show_extras_results: bool = True
    gfpgan_visibility: float = Field(0, ge=0, le=1, allow_inf_nan=False)
    codeformer_visibility: float = Field(0, ge=0, le=1, allow_inf_nan=False)
    codeformer_weight: float = Field(0, ge=0, le=1, allow_inf_nan=False)
    upscaling_resize: float = Field(2, ge=1, le=8, allow_inf_nan=False)
    upscaling_resize_w: int = Field(512, ge=1, le=UINT32_MAX)
    upscaling_resize_h: int = Field(512, ge=1, le=UINT32_MAX)
    upscaling_crop: bool = True
    upscaler_1: str = "None"
    upscaler_2: str = "None"
    extras_upscaler_2_visibility: float = Field(0, ge=0, le=1, allow_inf_nan=False)
    upscale_first: bool = False


class ExtrasSingleImageRequest(ExtrasRequest):
    image: str


class FileData(BaseModel):
    data: str
    name: str


class ExtrasBatchImagesRequest(ExtrasRequest):
    imageList: list[FileData]  # A1111's name


class InterrogateRequest(BaseModel):
    image: str = ""
    model: str = "clip"
