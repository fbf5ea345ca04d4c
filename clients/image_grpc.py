"""Generate an image straight from Triton (no frontend) with ``tritonclient.grpc``.

    python -m clients.image_grpc --url 127.0.0.1:8001 --model qwen_image \
        --prompt "a red fox in the snow" --size 64x64 --steps 2 --seed 7 --out /tmp/fox.png
    python -m clients.image_grpc --model qwen_image_edit --image in.png --prompt "make it blue" --out /tmp/e.png

The ensembles' inputs and outputs are in docs/image_contracts.md.
"""
from __future__ import annotations

import argparse

import numpy as np

_DTYPES = {np.object_: "BYTES", np.int32: "INT32", np.int64: "INT64", np.float32: "FP32", np.uint8: "UINT8"}


def image_inputs(prompt: str, *, width: int = 64, height: int = 64, steps: int = 2, seed: int = 0,
                 negative_prompt: str = "", true_cfg_scale: float = 4.0,
                 guidance_scale: float = 0.0, image: np.ndarray | None = None) -> list:
    """``tritonclient.grpc.InferInput`` list for one image of a diffusion ensemble.

    ``image`` (``uint8 [H, W, 3]`` RGB) is the condition image of ``qwen_image_edit``
    (``INPUT_IMAGE``); every tensor gets the batch dimension 1 (the ensembles batch).
    """
    import tritonclient.grpc as grpcclient

    values = {
        "PROMPT": np.array([[prompt.encode("utf-8")]], dtype=np.object_),
        "NEGATIVE_PROMPT": np.array([[negative_prompt.encode("utf-8")]], dtype=np.object_),
        "HEIGHT": np.array([[height]], np.int32), "WIDTH": np.array([[width]], np.int32),
        "NUM_INFERENCE_STEPS": np.array([[steps]], np.int32),
        "TRUE_CFG_SCALE": np.array([[true_cfg_scale]], np.float32),
        "GUIDANCE_SCALE": np.array([[guidance_scale]], np.float32),
        "SEED": np.array([[seed]], np.int64),
    }
    if image is not None:
        values["INPUT_IMAGE"] = np.ascontiguousarray(image, dtype=np.uint8)[None]
    inputs = []
    for name, array in values.items():
        t = grpcclient.InferInput(name, list(array.shape), _DTYPES[array.dtype.type])
        t.set_data_from_numpy(array)
        inputs.append(t)
    return inputs


def generate(client, model: str, prompt: str, **kwargs) -> tuple[np.ndarray, int, float]:
    """One image: (``uint8 [H, W, 3]``, denoising steps, denoiser seconds)."""
    result = client.infer(model, image_inputs(prompt, **kwargs))
    return (result.as_numpy("IMAGE")[0], int(result.as_numpy("NUM_STEPS").reshape(-1)[0]),
            float(result.as_numpy("DENOISE_SECONDS").reshape(-1)[0]))


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
    p.add_argument("--image", help="condition image (edit models)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    width, height = (int(v) for v in args.size.lower().split("x"))
    image = np.asarray(Image.open(args.image).convert("RGB")) if args.image else None
    client = grpcclient.InferenceServerClient(args.url)
    pixels, steps, seconds = generate(client, args.model, args.prompt, width=width, height=height,
                                      steps=args.steps, seed=args.seed,
                                      negative_prompt=args.negative_prompt,
                                      true_cfg_scale=args.true_cfg_scale, image=image)
    Image.fromarray(pixels).save(args.out)
    print(f"{args.out}: {pixels.shape[1]}x{pixels.shape[0]}, {steps} steps, denoiser {seconds:.3f} s")


if __name__ == "__main__":
    main()
