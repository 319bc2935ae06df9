// Command embeddings asks a node on this computer (make run) for the
// embeddings of two texts with the official OpenAI Go SDK: only the base
// URL changes.
package main

import (
	"context"
	"fmt"
	"log"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

func main() {
	client := openai.NewClient(
		option.WithBaseURL("http://127.0.0.1:11436/v1/"),
		option.WithAPIKey("any"), // the SDK wants one; on loopback any will do
	)
	res, err := client.Embeddings.New(context.Background(), openai.EmbeddingNewParams{
		Model: "onnx/tiny-bert/test-128",
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"hello", "world"}},
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, d := range res.Data {
		fmt.Printf("input %d: %d dimensions, first %.4f\n", d.Index, len(d.Embedding), d.Embedding[0])
	}
}
