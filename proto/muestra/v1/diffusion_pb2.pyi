from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DescribeDiffusionRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeDiffusionResponse(_message.Message):
    __slots__ = ("model", "device", "dtype", "pipeline", "default_width", "default_height", "max_width", "max_height", "max_steps", "max_images", "max_input_image_bytes", "max_input_image_pixels", "max_loras", "max_size_factor")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_WIDTH_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    MAX_WIDTH_FIELD_NUMBER: _ClassVar[int]
    MAX_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    MAX_STEPS_FIELD_NUMBER: _ClassVar[int]
    MAX_IMAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_INPUT_IMAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_INPUT_IMAGE_PIXELS_FIELD_NUMBER: _ClassVar[int]
    MAX_LORAS_FIELD_NUMBER: _ClassVar[int]
    MAX_SIZE_FACTOR_FIELD_NUMBER: _ClassVar[int]
    model: str
    device: str
    dtype: str
    pipeline: str
    default_width: int
    default_height: int
    max_width: int
    max_height: int
    max_steps: int
    max_images: int
    max_input_image_bytes: int
    max_input_image_pixels: int
    max_loras: int
    max_size_factor: float
    def __init__(self, model: _Optional[str] = ..., device: _Optional[str] = ..., dtype: _Optional[str] = ..., pipeline: _Optional[str] = ..., default_width: _Optional[int] = ..., default_height: _Optional[int] = ..., max_width: _Optional[int] = ..., max_height: _Optional[int] = ..., max_steps: _Optional[int] = ..., max_images: _Optional[int] = ..., max_input_image_bytes: _Optional[int] = ..., max_input_image_pixels: _Optional[int] = ..., max_loras: _Optional[int] = ..., max_size_factor: _Optional[float] = ...) -> None: ...

class ListSchedulersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SchedulerInfo(_message.Message):
    __slots__ = ("name", "aliases", "plugin", "distribution", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ALIASES_FIELD_NUMBER: _ClassVar[int]
    PLUGIN_FIELD_NUMBER: _ClassVar[int]
    DISTRIBUTION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    aliases: _containers.RepeatedScalarFieldContainer[str]
    plugin: str
    distribution: str
    version: str
    def __init__(self, name: _Optional[str] = ..., aliases: _Optional[_Iterable[str]] = ..., plugin: _Optional[str] = ..., distribution: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class ListSchedulersResponse(_message.Message):
    __slots__ = ("schedulers",)
    SCHEDULERS_FIELD_NUMBER: _ClassVar[int]
    schedulers: _containers.RepeatedCompositeFieldContainer[SchedulerInfo]
    def __init__(self, schedulers: _Optional[_Iterable[_Union[SchedulerInfo, _Mapping]]] = ...) -> None: ...

class ListLorasRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LoraInfo(_message.Message):
    __slots__ = ("name", "file", "size_bytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    file: str
    size_bytes: int
    def __init__(self, name: _Optional[str] = ..., file: _Optional[str] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class ListLorasResponse(_message.Message):
    __slots__ = ("loras",)
    LORAS_FIELD_NUMBER: _ClassVar[int]
    loras: _containers.RepeatedCompositeFieldContainer[LoraInfo]
    def __init__(self, loras: _Optional[_Iterable[_Union[LoraInfo, _Mapping]]] = ...) -> None: ...

class LoraWeight(_message.Message):
    __slots__ = ("name", "weight")
    NAME_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    name: str
    weight: float
    def __init__(self, name: _Optional[str] = ..., weight: _Optional[float] = ...) -> None: ...

class ImageRequest(_message.Message):
    __slots__ = ("model", "prompt", "negative_prompt", "width", "height", "steps", "guidance_scale", "seed", "sampler", "num_images", "preview_every", "extra", "init_image", "strength", "mask_image", "mask_from_alpha", "invert_mask", "mask_blur", "padding_mask_crop", "loras")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_PROMPT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    GUIDANCE_SCALE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    SAMPLER_FIELD_NUMBER: _ClassVar[int]
    NUM_IMAGES_FIELD_NUMBER: _ClassVar[int]
    PREVIEW_EVERY_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    INIT_IMAGE_FIELD_NUMBER: _ClassVar[int]
    STRENGTH_FIELD_NUMBER: _ClassVar[int]
    MASK_IMAGE_FIELD_NUMBER: _ClassVar[int]
    MASK_FROM_ALPHA_FIELD_NUMBER: _ClassVar[int]
    INVERT_MASK_FIELD_NUMBER: _ClassVar[int]
    MASK_BLUR_FIELD_NUMBER: _ClassVar[int]
    PADDING_MASK_CROP_FIELD_NUMBER: _ClassVar[int]
    LORAS_FIELD_NUMBER: _ClassVar[int]
    model: str
    prompt: str
    negative_prompt: str
    width: int
    height: int
    steps: int
    guidance_scale: float
    seed: int
    sampler: str
    num_images: int
    preview_every: int
    extra: _struct_pb2.Struct
    init_image: bytes
    strength: float
    mask_image: bytes
    mask_from_alpha: bool
    invert_mask: bool
    mask_blur: int
    padding_mask_crop: int
    loras: _containers.RepeatedCompositeFieldContainer[LoraWeight]
    def __init__(self, model: _Optional[str] = ..., prompt: _Optional[str] = ..., negative_prompt: _Optional[str] = ..., width: _Optional[int] = ..., height: _Optional[int] = ..., steps: _Optional[int] = ..., guidance_scale: _Optional[float] = ..., seed: _Optional[int] = ..., sampler: _Optional[str] = ..., num_images: _Optional[int] = ..., preview_every: _Optional[int] = ..., extra: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., init_image: _Optional[bytes] = ..., strength: _Optional[float] = ..., mask_image: _Optional[bytes] = ..., mask_from_alpha: _Optional[bool] = ..., invert_mask: _Optional[bool] = ..., mask_blur: _Optional[int] = ..., padding_mask_crop: _Optional[int] = ..., loras: _Optional[_Iterable[_Union[LoraWeight, _Mapping]]] = ...) -> None: ...

class ImageProgress(_message.Message):
    __slots__ = ("image_index", "step", "total", "elapsed_s", "preview_png")
    IMAGE_INDEX_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_S_FIELD_NUMBER: _ClassVar[int]
    PREVIEW_PNG_FIELD_NUMBER: _ClassVar[int]
    image_index: int
    step: int
    total: int
    elapsed_s: float
    preview_png: bytes
    def __init__(self, image_index: _Optional[int] = ..., step: _Optional[int] = ..., total: _Optional[int] = ..., elapsed_s: _Optional[float] = ..., preview_png: _Optional[bytes] = ...) -> None: ...

class GeneratedImage(_message.Message):
    __slots__ = ("index", "seed", "png", "width", "height", "parameters")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    PNG_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    index: int
    seed: int
    png: bytes
    width: int
    height: int
    parameters: str
    def __init__(self, index: _Optional[int] = ..., seed: _Optional[int] = ..., png: _Optional[bytes] = ..., width: _Optional[int] = ..., height: _Optional[int] = ..., parameters: _Optional[str] = ...) -> None: ...

class ImageResponse(_message.Message):
    __slots__ = ("progress", "image")
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    progress: ImageProgress
    image: GeneratedImage
    def __init__(self, progress: _Optional[_Union[ImageProgress, _Mapping]] = ..., image: _Optional[_Union[GeneratedImage, _Mapping]] = ...) -> None: ...
