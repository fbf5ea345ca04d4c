"""Generate an image straight from Triton (no frontend) with ``tritonclient.grpc``.

    python -m clients.image_grpc --url 127.0.0.1:8001 --model qwen_image \
        --prompt "a red fox in the snow" --size 64x64 --steps 2 --seed 7 --out /tmp/fox.png
    python -m clients.image_grpc --model qwen_image_edit --image in.png --prompt "make it blue" --out /tmp/e.png
    python -m clients.image_grpc --model qwen_image_inpaint --image in.png --mask mask.png \
        --prompt "a red balloon" --strength 0.8 --out /tmp/i.png   (mask: OpenAI's, alpha 0 = repaint)
    python -m clients.image_grpc --model qwen_image_edit_plus --image a.png --image b.png \
        --prompt "the cat of picture 1 on the sofa of picture 2" --out /tmp/p.png

The ensembles' inputs and outputs are in docs/image_contracts.md.
"""
from __future__ import annotations

import argparse
from functools import partial

import numpy as np

from omni_triton.contracts import image as contract
from omni_triton.contracts.tensors import infer_input, wrap_inputs


def image_inputs(prompt: str, *, width: int = 64, height: int = 64, steps: int = 2, seed: int = 0,
                 negative_prompt: str = "", true_cfg_scale: float = 4.0,
                 guidance_scale: float = 0.0, image: np.ndarray | None = None,
                 images: list[np.ndarray] | None = None, lora_id: str | None = None,
                 lora_scale: float = 1.0, mask: np.ndarray | None = None,
                 strength: float | None = None) -> list:
    """``tritonclient.grpc.InferInput`` list for one image of a diffusion ensemble
    (``omni_triton.contracts.image.image_inputs``).

    ``image`` (``uint8 [H, W, 3]`` RGB) is the condition image of ``qwen_image_edit``
    (``INPUT_IMAGE``), or the image ``qwen_image_inpaint`` repaints where ``mask`` (``uint8
    [H, W]``, diffusers' convention: 255 = repaint) is white, with ``strength`` in (0, 1];
    ``images`` the condition images of ``qwen_image_edit_plus`` (``INPUT_IMAGES`` +
    ``INPUT_IMAGE_SIZES``); ``lora_id`` (a registered adapter's id, ``GET /v1/loras``) and
    ``lora_scale`` select a LoRA adapter (docs/lora.md); every tensor gets the batch dimension 1
    (the ensembles batch).
    """
    import tritonclient.grpc as grpcclient

    pairs = contract.image_inputs(prompt, width=width, height=height, steps=steps, seed=seed,
                                  negative_prompt=negative_prompt, true_cfg_scale=true_cfg_scale,
                                  guidance_scale=guidance_scale, image=image, images=images,
                                  lora_id=lora_id, lora_scale=lora_scale, mask=mask, strength=strength)
    return wrap_inputs(pairs, partial(infer_input, grpcclient.InferInput))


def generate(client, model: str, prompt: str, **kwargs) -> tuple[np.ndarray, int, float]:
    """One image: (``uint8 [H, W, 3]``, denoising steps, denoiser seconds)."""
    result = client.infer(model, image_inputs(prompt, **kwargs))
    return (result.as_numpy(contract.IMAGE)[0], int(result.as_numpy(contract.NUM_STEPS).reshape(-1)[0]),
            float(result.as_numpy(contract.DENOISE_SECONDS).reshape(-1)[0]))


def main(argv=None) -> None:
    import tritonclient.grpc as grpcclient
    from PIL import Image

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="127.0.0.1:8001")
    p.add_argument("--model", default="qwen_image")
    p.add_argument("--prompt", required=True)
    p.add_argument("--negative-prompt", default="")
    p.add_argument("--size", default="64x64", help="WIDTHxHEIGHT")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--true-cfg-scale", type=float, default=4.0)
    p.add_argument("--image", action="append",
                   help="condition image (edit models); repeat for qwen_image_edit_plus (1-3 images)")
    p.add_argument("--lora-id", help="a registered LoRA adapter's id (GET /v1/loras): docs/lora.md")
    p.add_argument("--lora-scale", type=float, default=1.0)
    p.add_argument("--mask", help="OpenAI mask (PNG with alpha; alpha 0 = repaint) for qwen_image_inpaint")
    p.add_argument("--strength", type=float, default=0.6, help="inpainting strength (0, 1]")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    width, height = (int(v) for v in args.size.lower().split("x"))
    images = [np.asarray(Image.open(path).convert("RGB")) for path in args.image or ()]
    multi = args.model == "qwen_image_edit_plus" or len(images) > 1
    mask = None
    if args.mask:
        from omni_triton.media.image import decode_mask_alpha

        with open(args.mask, "rb") as f:
            mask = contract.diffusers_mask_from_alpha(decode_mask_alpha(f.read()))
    client = grpcclient.InferenceServerClient(args.url)
    pixels, steps, seconds = generate(client, args.model, args.prompt, width=width, height=height,
                                      steps=args.steps, seed=args.seed,
                                      negative_prompt=args.negative_prompt,
                                      true_cfg_scale=args.true_cfg_scale,
                                      image=images[0] if images and not multi else None,
                                      images=images if images and multi else None,
                                      lora_id=args.lora_id, lora_scale=args.lora_scale, mask=mask,
                                      strength=args.strength if mask is not None else None)
    Image.fromarray(pixels).save(args.out)
    print(f"{args.out}: {pixels.shape[1]}x{pixels.shape[0]}, {steps} steps, denoiser {seconds:.3f} s")


if __name__ == "__main__":
    main()
