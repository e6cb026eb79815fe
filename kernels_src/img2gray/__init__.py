"""CPU kernel of the img2gray package: the same integer arithmetic as img2gray.cu."""

import torch


def img2gray_cpu(image: torch.Tensor) -> torch.Tensor:
    rgb = image.to(torch.int32)
    gray = (77 * rgb[..., 0] + 150 * rgb[..., 1] + 29 * rgb[..., 2] + 128) >> 8
    return gray.to(torch.uint8)
