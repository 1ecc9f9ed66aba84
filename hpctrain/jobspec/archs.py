"""The torchvision classification models ``trainer.arch`` may name, without importing torch.

Login nodes check ``trainer.arch`` against this table (``hpctrain validate``);
the trainer builds the model with ``torchvision.models.get_model``. A unit test
compares the table with the installed torchvision's ``list_models`` so it
cannot drift. Custom models are not an arch: write an ``entrypoint``.
"""

from __future__ import annotations

import difflib

# Millions of parameters, from torchvision's weights metadata (torchvision 0.29).
ARCH_PARAMS_M: dict[str, float] = {
    "alexnet": 61.1, "convnext_base": 88.6, "convnext_large": 197.8, "convnext_small": 50.2, "convnext_tiny": 28.6,
    "densenet121": 8.0, "densenet161": 28.7, "densenet169": 14.1, "densenet201": 20.0, "efficientnet_b0": 5.3,
    "efficientnet_b1": 7.8, "efficientnet_b2": 9.1, "efficientnet_b3": 12.2, "efficientnet_b4": 19.3,
    "efficientnet_b5": 30.4, "efficientnet_b6": 43.0, "efficientnet_b7": 66.3, "efficientnet_v2_l": 118.5,
    "efficientnet_v2_m": 54.1, "efficientnet_v2_s": 21.5, "googlenet": 6.6, "inception_v3": 27.2, "maxvit_t": 30.9,
    "mnasnet0_5": 2.2, "mnasnet0_75": 3.2, "mnasnet1_0": 4.4, "mnasnet1_3": 6.3, "mobilenet_v2": 3.5,
    "mobilenet_v3_large": 5.5, "mobilenet_v3_small": 2.5, "regnet_x_16gf": 54.3, "regnet_x_1_6gf": 9.2,
    "regnet_x_32gf": 107.8, "regnet_x_3_2gf": 15.3, "regnet_x_400mf": 5.5, "regnet_x_800mf": 7.3,
    "regnet_x_8gf": 39.6, "regnet_y_128gf": 644.8, "regnet_y_16gf": 83.6, "regnet_y_1_6gf": 11.2,
    "regnet_y_32gf": 145.0, "regnet_y_3_2gf": 19.4, "regnet_y_400mf": 4.3, "regnet_y_800mf": 6.4,
    "regnet_y_8gf": 39.4, "resnet101": 44.5, "resnet152": 60.2, "resnet18": 11.7, "resnet34": 21.8,
    "resnet50": 25.6, "resnext101_32x8d": 88.8, "resnext101_64x4d": 83.5, "resnext50_32x4d": 25.0,
    "shufflenet_v2_x0_5": 1.4, "shufflenet_v2_x1_0": 2.3, "shufflenet_v2_x1_5": 3.5, "shufflenet_v2_x2_0": 7.4,
    "squeezenet1_0": 1.2, "squeezenet1_1": 1.2, "swin_b": 87.8, "swin_s": 49.6, "swin_t": 28.3, "swin_v2_b": 87.9,
    "swin_v2_s": 49.7, "swin_v2_t": 28.4, "vgg11": 132.9, "vgg11_bn": 132.9, "vgg13": 133.0, "vgg13_bn": 133.1,
    "vgg16": 138.4, "vgg16_bn": 138.4, "vgg19": 143.7, "vgg19_bn": 143.7, "vit_b_16": 86.6, "vit_b_32": 88.2,
    "vit_h_14": 633.5, "vit_l_16": 304.3, "vit_l_32": 306.5, "wide_resnet101_2": 126.9, "wide_resnet50_2": 68.9,
}  # fmt: skip


def unknown_arch_message(arch: str) -> str:
    """What to say about an arch torchvision does not have."""
    close = difflib.get_close_matches(arch, ARCH_PARAMS_M, n=4, cutoff=0.6)
    text = f"{arch!r} is not a torchvision classification model"
    if close:
        return text + f"; did you mean {', '.join(close)}?"
    families = sorted({name.rstrip("0123456789_").split("_")[0] for name in ARCH_PARAMS_M})
    return text + f" (families: {', '.join(families)})"
