// Package vision holds the in-process vision engines behind
// POST /v1/vision/detections and POST /v1/vision/faces: CenterNet object
// detection (LoadDetector, engine.TaskObjectDetection) and BlazeFace face
// detection with optional HSE FaceRes descriptors (LoadFaces,
// engine.TaskFaceDetection). Both run ONNX models through the node's
// onnx.Runtime; pre-processing (resizing, letterboxing, face crops,
// normalisation) and post-processing (peak search, anchor decoding, NMS,
// L2 normalisation) are plain Go. DESIGN.md describes the pipelines, the
// defaults and the models' licences; scripts/assets-vision.sh installs the
// model folders.
package vision
