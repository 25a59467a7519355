"""The built-in schedulers, registered through the same hook as third-party ones.

Names follow A1111/ComfyUI; the diffusers class name and the A1111 display name are aliases.
Each scheduler is built from the loaded model's own scheduler config.
"""

from __future__ import annotations

from diffusers import (
    DDIMScheduler,
    DDPMScheduler,
    DPMSolverMultistepScheduler,
    EulerAncestralDiscreteScheduler,
    EulerDiscreteScheduler,
    HeunDiscreteScheduler,
    LCMScheduler,
    LMSDiscreteScheduler,
    PNDMScheduler,
    UniPCMultistepScheduler,
)

from muestra.plugin import hookimpl


def dpmpp_2m_karras(base_config):
    """DPM-Solver++(2M) on the Karras noise schedule."""
    return DPMSolverMultistepScheduler.from_config(base_config, use_karras_sigmas=True)


@hookimpl
def register_schedulers(register):
    register("euler", EulerDiscreteScheduler, aliases=("EulerDiscreteScheduler", "Euler", "k_euler"))
    register(
        "euler_a",
        EulerAncestralDiscreteScheduler,
        aliases=("EulerAncestralDiscreteScheduler", "Euler a", "euler_ancestral", "k_euler_a"),
    )
    register("ddim", DDIMScheduler, aliases=("DDIMScheduler", "DDIM"))
    register("ddpm", DDPMScheduler, aliases=("DDPMScheduler", "DDPM"))
    register("pndm", PNDMScheduler, aliases=("PNDMScheduler", "PLMS"))
    register("lms", LMSDiscreteScheduler, aliases=("LMSDiscreteScheduler", "LMS", "k_lms"))
    register("heun", HeunDiscreteScheduler, aliases=("HeunDiscreteScheduler", "Heun", "k_heun"))
    register("dpmpp_2m", DPMSolverMultistepScheduler, aliases=("DPMSolverMultistepScheduler", "DPM++ 2M"))
    register("dpmpp_2m_karras", dpmpp_2m_karras, aliases=("DPM++ 2M Karras",))
    register("unipc", UniPCMultistepScheduler, aliases=("UniPCMultistepScheduler", "UniPC", "uni_pc"))
    register("lcm", LCMScheduler, aliases=("LCMScheduler", "LCM"))
