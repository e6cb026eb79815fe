import pytest
import torch

import kjit
from conftest import cuda


def reference(image: torch.Tensor) -> torch.Tensor:
    rgb = image.to(torch.int64).cpu()
    return ((77 * rgb[..., 0] + 150 * rgb[..., 1] + 29 * rgb[..., 2] + 128) >> 8).to(torch.uint8)


def random_image(h, w, device="cpu"):
    return torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, device=device)


@pytest.fixture(scope="module")
def img2gray():
    return kjit.load("img2gray")


def test_ops_appear_under_torch_ops(img2gray):
    assert img2gray.img2gray is torch.ops.img2gray.img2gray
    assert "img2gray(Tensor image) -> Tensor" in img2gray.__doc__
    assert img2gray.__version__ == "1.0.0"
    assert kjit.load("img2gray") is img2gray


def test_cpu_matches_reference(img2gray):
    for h, w in [(1, 1), (37, 53), (256, 320)]:
        image = random_image(h, w)
        assert torch.equal(img2gray.img2gray(image), reference(image))


def test_opcheck_cpu(img2gray):
    torch.library.opcheck(torch.ops.img2gray.img2gray.default, (random_image(9, 13),))


def test_compile_dynamic_cpu(img2gray):
    fn = torch.compile(lambda x: img2gray.img2gray(x).float() / 255, fullgraph=True, dynamic=True)
    for h, w in [(8, 8), (17, 31), (64, 3)]:
        image = random_image(h, w)
        assert torch.equal(fn(image), reference(image).float() / 255)


@cuda
def test_cuda_is_byte_exact(img2gray):
    for h, w in [(1, 1), (719, 1037), (2048, 4096)]:
        image = random_image(h, w, "cuda")
        out = img2gray.img2gray(image)
        assert out.device == image.device and out.dtype == torch.uint8
        assert torch.equal(out.cpu(), reference(image))


@cuda
def test_opcheck_cuda(img2gray):
    torch.library.opcheck(torch.ops.img2gray.img2gray.default, (random_image(33, 65, "cuda"),))


@cuda
def test_compile_dynamic_cuda(img2gray):
    fn = torch.compile(lambda x: img2gray.img2gray(x), fullgraph=True, dynamic=True)
    for h, w in [(8, 8), (100, 77)]:
        image = random_image(h, w, "cuda")
        assert torch.equal(fn(image).cpu(), reference(image))


@cuda
def test_runs_on_the_current_stream(img2gray):
    image = random_image(512, 512, "cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out = img2gray.img2gray(image)
    stream.synchronize()
    assert torch.equal(out.cpu(), reference(image))


@cuda
def test_cuda_unaligned_image_takes_the_bytewise_path(img2gray):
    # A view starting one pixel into a buffer: its pointer is not 16-byte aligned.
    base = random_image(65, 97, "cuda")
    image = base.view(-1, 3)[1:].reshape(64 * 97 + 96, 1, 3)[: 64 * 97].reshape(64, 97, 3)
    assert image.data_ptr() % 16 != 0 and image.is_contiguous()
    assert torch.equal(img2gray.img2gray(image).cpu(), reference(image))


@cuda
@pytest.mark.parametrize("pixels", [15, 16, 17, 4095, 4096, 4097])
def test_cuda_tails_of_the_16_pixel_groups(img2gray, pixels):
    image = random_image(1, pixels, "cuda")
    assert torch.equal(img2gray.img2gray(image).cpu(), reference(image))
