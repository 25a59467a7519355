"""Prometheus metrics of the diffusion service."""

from prometheus_client import Counter, Gauge, Histogram

DENOISE_STEPS = Counter("muestra_diffusion_denoise_steps_total", "Denoising steps run (progress steps, all images)")
IMAGES = Counter("muestra_diffusion_images_total", "Images generated")
CANCELLED = Counter("muestra_diffusion_cancelled_total", "Generations stopped because the client went away")
QUEUE_DEPTH = Gauge("muestra_diffusion_queue_depth", "Generations running or waiting")
IMAGE_SECONDS = Histogram(
    "muestra_diffusion_image_seconds",
    "Time to make one image, text encoding to PNG",
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160),
)
