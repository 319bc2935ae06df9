package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// envFlag binds a flag to a SERVICE_* variable: the variable supplies the
// default, the flag wins when given. Bad values in either fail start-up.
type envFlags struct {
	fs   *flag.FlagSet
	errs []string
	// rows documents every flag for `infermesh serve -h` and docs/configuration.md.
	rows [][3]string
}

func newEnvFlags(name string) *envFlags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	return &envFlags{fs: fs}
}

func (e *envFlags) env(name string) (string, bool) {
	v, ok := os.LookupEnv(name)
	return strings.TrimSpace(v), ok && strings.TrimSpace(v) != ""
}

func (e *envFlags) String(p *string, flagName, envName, def, usage string) {
	if v, ok := e.env(envName); ok {
		def = v
	}
	e.fs.StringVar(p, flagName, def, usage+" ("+envName+")")
	e.rows = append(e.rows, [3]string{flagName, envName, usage})
}

func (e *envFlags) Bool(p *bool, flagName, envName string, def bool, usage string) {
	if v, ok := e.env(envName); ok {
		b, err := parseBool(v)
		if err != nil {
			e.errs = append(e.errs, fmt.Sprintf("%s=%q: %v", envName, v, err))
		} else {
			def = b
		}
	}
	e.fs.BoolVar(p, flagName, def, usage+" ("+envName+")")
	e.rows = append(e.rows, [3]string{flagName, envName, usage})
}

func (e *envFlags) Int(p *int, flagName, envName string, def int, usage string) {
	if v, ok := e.env(envName); ok {
		n, err := strconv.Atoi(v)
		if err != nil {
			e.errs = append(e.errs, fmt.Sprintf("%s=%q: not an integer", envName, v))
		} else {
			def = n
		}
	}
	e.fs.IntVar(p, flagName, def, usage+" ("+envName+")")
	e.rows = append(e.rows, [3]string{flagName, envName, usage})
}

func (e *envFlags) Int64(p *int64, flagName, envName string, def int64, usage string) {
	if v, ok := e.env(envName); ok {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			e.errs = append(e.errs, fmt.Sprintf("%s=%q: not an integer", envName, v))
		} else {
			def = n
		}
	}
	e.fs.Int64Var(p, flagName, def, usage+" ("+envName+")")
	e.rows = append(e.rows, [3]string{flagName, envName, usage})
}

func (e *envFlags) Duration(p *time.Duration, flagName, envName string, def time.Duration, usage string) {
	if v, ok := e.env(envName); ok {
		d, err := time.ParseDuration(v)
		if err != nil {
			e.errs = append(e.errs, fmt.Sprintf("%s=%q: not a duration like 500ms or 30s", envName, v))
		} else {
			def = d
		}
	}
	e.fs.DurationVar(p, flagName, def, usage+" ("+envName+")")
	e.rows = append(e.rows, [3]string{flagName, envName, usage})
}

// List binds a comma-separated list.
func (e *envFlags) List(p *[]string, flagName, envName string, usage string) {
	if v, ok := e.env(envName); ok {
		*p = splitList(v)
	}
	fromEnv := true
	e.fs.Func(flagName, usage+", comma-separated ("+envName+")", func(s string) error {
		if fromEnv { // the first flag replaces the variable's list; later ones add
			*p, fromEnv = nil, false
		}
		*p = append(*p, splitList(s)...)
		return nil
	})
	e.rows = append(e.rows, [3]string{flagName, envName, usage})
}

func (e *envFlags) Parse(args []string) error {
	if err := e.fs.Parse(args); err != nil {
		return err
	}
	if len(e.errs) > 0 {
		return fmt.Errorf("bad environment:\n  %s", strings.Join(e.errs, "\n  "))
	}
	if e.fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(e.fs.Args(), " "))
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func parseBool(s string) (bool, error) {
	switch strings.ToLower(s) {
	case "1", "true", "yes", "on":
		return true, nil
	case "0", "false", "no", "off":
		return false, nil
	}
	return false, fmt.Errorf("want 1/0, true/false, yes/no or on/off")
}
