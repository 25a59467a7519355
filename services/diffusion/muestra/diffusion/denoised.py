"""Each step's estimate of the final latents (the predicted x0): what a preview shows, as in A1111 and ComfyUI.

The latents between steps (x_t) are mostly noise until the last few steps, and Euler-type schedulers keep
them scaled by sigma (a standard deviation of about 14 at the first step): a preview of x_t shows noise
for most of the run. The scheduler's own estimate (`pred_original_sample`, LCM's `denoised`) is used where its
step returns one; otherwise it is computed from the step's model output, for schedulers whose latents are
not sigma-scaled (PNDM, DPM-Solver++, UniPC).
"""

from __future__ import annotations

import functools
from typing import Any

import torch


def estimate_from_model_output(
    scheduler: Any, model_output: torch.Tensor, timestep: Any, sample: torch.Tensor
) -> torch.Tensor | None:
    """x0 from x_t = sqrt(a) x0 + sqrt(1 - a) noise, a = alphas_cumprod[t]; None where that does not hold."""
    if float(getattr(scheduler, "init_noise_sigma", 1.0)) != 1.0 or not hasattr(scheduler, "alphas_cumprod"):
        return None  # sigma-scaled latents: the Euler-type schedulers return their estimate themselves
    alpha = scheduler.alphas_cumprod[int(timestep)].to(sample.device, torch.float32)
    x, output = sample.float(), model_output.float()
    prediction = scheduler.config.prediction_type
    if prediction == "epsilon":
        return (x - (1 - alpha).sqrt() * output) / alpha.sqrt()
    if prediction == "v_prediction":
        return alpha.sqrt() * x - (1 - alpha).sqrt() * output
    if prediction == "sample":
        return output
    return None


class DenoisedEstimate:
    """Wraps one scheduler's `step` and keeps the last step's estimate of the final latents in `latest`."""

    def __init__(self, scheduler: Any) -> None:
        self.latest: torch.Tensor | None = None
        step = scheduler.step

        # The pipeline passes `generator` and `eta` only to a step whose signature names them: wraps keeps step's.
        @functools.wraps(step)
        def step_keeping_estimate(model_output, timestep, sample, *args, return_dict: bool = True, **kwargs):
            output = step(model_output, timestep, sample, *args, return_dict=True, **kwargs)
            if isinstance(output, tuple):  # a scheduler that ignores return_dict: nothing named to read
                self.latest = estimate_from_model_output(scheduler, model_output, timestep, sample)
                return output
            estimate = getattr(output, "pred_original_sample", None)
            if estimate is None:
                estimate = getattr(output, "denoised", None)
            if estimate is None:
                estimate = estimate_from_model_output(scheduler, model_output, timestep, sample)
            self.latest = estimate
            return output if return_dict else output.to_tuple()

        scheduler.step = step_keeping_estimate
