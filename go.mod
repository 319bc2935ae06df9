module github.com/infermesh/infermesh

go 1.26.8

require github.com/yalue/onnxruntime_go v1.27.0
