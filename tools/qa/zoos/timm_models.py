"""timm: one small variant of each of 50-odd families, built by ``timm.create_model(name,
pretrained=False, num_classes=10, drop_rate=0, drop_path_rate=0)`` (the rates a model does not
take are left out) on 64x64 images where the model takes them."""

from __future__ import annotations

from zoos.common import IMAGE, Model, image_body, model_file

ZOO = "timm"
QUICK = ("poolformer_s12",)  # AvgPool2d(count_include_pad=False) once lost
# models whose patch grid is fixed at construction: built with img_size=64
SIZED = {
    "cait_xxs24_224", "coat_lite_tiny", "convit_tiny", "deit_tiny_patch16_224",
    "eva02_tiny_patch14_224", "gcvit_xxtiny", "levit_128s", "maxvit_tiny_tf_224",
    "mixer_s16_224", "mobilevit_xxs", "repvgg_a0", "resmlp_12_224", "sequencer2d_s",
    "swin_tiny_patch4_window7_224", "twins_svt_small", "vit_tiny_patch16_224",
    "xcit_nano_12_p16_224", "gmlp_ti16_224",
}  # fmt: skip
# models that need their own image side (no img_size argument, or one 64 does not fit)
SIDES = {
    "efficientformer_l1": 224, "halonet26t": 256, "hiera_tiny_224": 224, "inception_v3": 96,
}  # fmt: skip
FAMILIES = (
    "resnet18", "efficientnet_b0", "mobilenetv3_small_100", "mobilenetv4_conv_small",
    "convnext_atto", "vit_tiny_patch16_224", "deit_tiny_patch16_224",
    "swin_tiny_patch4_window7_224", "poolformer_s12", "efficientformer_l1", "regnetx_002",
    "densenet121", "dla34", "dpn68", "ghostnet_100", "hrnet_w18_small", "levit_128s",
    "mixer_s16_224", "mobilevit_xxs", "nfnet_l0", "rexnet_100", "res2net50_14w_8s",
    "resnest14d", "selecsls42b", "coat_lite_tiny", "convit_tiny", "crossvit_tiny_240",
    "cait_xxs24_224", "xcit_nano_12_p16_224", "edgenext_xx_small", "maxvit_tiny_tf_224",
    "tinynet_a", "lcnet_050", "repvgg_a0", "fastvit_t8", "efficientvit_b0", "inception_v3",
    "tresnet_m", "cspresnet50", "eva02_tiny_patch14_224", "pvt_v2_b0", "twins_svt_small",
    "gcvit_xxtiny", "hgnetv2_b0", "mambaout_femto", "tiny_vit_5m_224", "ese_vovnet19b_dw",
    "xception41", "skresnet18", "lambda_resnet26t", "halonet26t", "mobileone_s0",
    "focalnet_tiny_srf", "hiera_tiny_224", "sequencer2d_s", "resmlp_12_224", "gmlp_ti16_224",
)  # fmt: skip

BUILD = """import timm

for drop in ({{"drop_rate": 0.0, "drop_path_rate": 0.0}}, {{"drop_rate": 0.0}}, {{}}):
    try:  # the dropout rates this model takes
        return timm.create_model(
            {name!r}, pretrained=False, num_classes=CLASSES{extra}, **drop
        )
    except TypeError as err:
        if "drop" not in str(err):
            raise
raise TypeError("no dropout rates accepted")"""


def names(zoo_dir: str) -> list[str]:
    del zoo_dir  # a fixed list: one variant per family
    return list(FAMILIES)


def model(name: str, zoo_dir: str) -> Model:
    side = SIDES.get(name, IMAGE)
    extra = ", img_size=SIZE" if name in SIZED else ""
    build = BUILD.format(name=name, extra=extra)
    return Model(ZOO, name, model_file(ZOO, name, image_body(build, side), zoo_dir))
