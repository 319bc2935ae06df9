// Package vision holds the in-process vision engines behind
// POST /v1/vision/detections, POST /v1/vision/faces and image description:
// CenterNet or Ultralytics YOLOv8/YOLO11 object detection (LoadDetector,
// LoadYOLO; engine.TaskObjectDetection), BlazeFace face detection with
// optional HSE FaceRes descriptors or SCRFD with ArcFace (LoadFaces,
// LoadSCRFD; engine.TaskFaceDetection), PP-OCRv4 text reading (LoadOCR,
// engine.TaskTextRecognition) and image description by the composed
// describer or Florence-2 (LoadComposedDescriber, LoadFlorence;
// engine.TaskImageDescription). All run ONNX models through the node's
// onnx.Runtime; pre-processing (resizing, letterboxing, face crops,
// normalisation) and post-processing (peak search, anchor decoding, NMS,
// L2 normalisation) are plain Go. DESIGN.md describes the pipelines, the
// defaults and the models' licences; scripts/assets-vision.sh installs the
// model folders.
package vision
