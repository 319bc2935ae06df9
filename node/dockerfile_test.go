package node_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/infermesh/infermesh/node/audioenc"
	"github.com/infermesh/infermesh/node/engine/tts"
)

// programPackages are the programs the node runs, each with the Debian
// package that carries it and the file that runs it.
var programPackages = []struct{ program, pkg, file string }{
	{tts.EspeakProgram, "espeak-ng", "node/engine/tts/g2p.go"},
	{audioenc.FFmpegProgram, "ffmpeg", "node/audioenc/ffmpeg.go"},
}

// TestDockerfileInstallsWhatEnginesRun: the container image's runtime
// stage installs the Debian package of every program the engines run,
// and no other file of the node's packages runs programs (a new one must
// be listed above, and so installed in the image).
func TestDockerfileInstallsWhatEnginesRun(t *testing.T) {
	raw, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	_, runtime, ok := strings.Cut(string(raw), " AS runtime")
	if !ok {
		t.Fatal("the Dockerfile has no runtime stage")
	}
	runtime = strings.ReplaceAll(runtime, "\\\n", " ")
	var installed []string
	for _, m := range regexp.MustCompile(`apt-get install ([^&\n]*)`).FindAllStringSubmatch(runtime, -1) {
		for _, w := range strings.Fields(m[1]) {
			if !strings.HasPrefix(w, "-") {
				installed = append(installed, w)
			}
		}
	}
	for _, p := range programPackages {
		if !slices.Contains(installed, p.pkg) {
			t.Errorf("the runtime stage does not install %s (for %s, run by %s); it installs %v", p.pkg, p.program, p.file, installed)
		}
	}

	// Every non-test file of the module's servers that imports os/exec.
	module, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	var runners []string
	for _, root := range []string{"node", "mesh", "consensus", "cmd"} {
		err := filepath.WalkDir(filepath.Join(module, root), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
			if err != nil {
				return err
			}
			for _, imp := range f.Imports {
				if p, _ := strconv.Unquote(imp.Path.Value); p == "os/exec" {
					rel, _ := filepath.Rel(module, path)
					runners = append(runners, filepath.ToSlash(rel))
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	known := []string{"node/engine/onnx/onnxtest/photo.go"} // test helper: runs go env
	for _, p := range programPackages {
		known = append(known, p.file)
	}
	for _, r := range runners {
		if !slices.Contains(known, r) {
			t.Errorf("%s runs programs; list them in programPackages and install their packages in the Dockerfile", r)
		}
	}
}
