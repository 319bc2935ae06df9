// Package tts holds the text-to-speech and voice-cloning engines behind
// POST /v1/audio/speech and POST /v1/audio/clone:
//
//   - LoadKokoro: Kokoro-82M v1.0 (ONNX, 24 kHz, 41 voices in seven
//     languages), installed by scripts/assets-tts.sh;
//   - LoadPiper: any Piper (VITS) voice, .onnx plus .onnx.json;
//   - LoadCloner: Kokoro followed by OpenVoice v2's tone-colour converter,
//     which gives the speech the timbre of a 3-30 s reference clip.
//
// Text goes through espeak-ng (a separate program, GPL-3, never linked) for
// normalisation and phonemes, sentence by sentence; each sentence (cut
// further when it exceeds the model's context) is one model run, and its
// audio is emitted as soon as it is ready, so the API can stream. See
// DESIGN.md for the choices.
package tts
