// Command linearizability checks a history of dbwrap operations, recorded by
// the conformance driver's concurrent clients, for linearizability with
// Porcupine. The model is one integer register per key, starting at 0; the
// history is partitioned by key, since keys are independent.
//
// Usage: linearizability [-timeout 30s] HISTORY.jsonl
//
// Exit status: 0 linearizable, 1 not linearizable, 2 bad usage or malformed
// history, 3 undecided within the timeout.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

const maxListed = 10

// op is one completed call: for get, output is the value read; for put,
// input is the value written; for rmw (an atomic increment), output is the
// value before the increment.
type op struct {
	client        int
	kind, key     string
	input, output int64
	call, ret     int64
}

// line is one history line as written; pointers tell missing from zero.
type line struct {
	Client *int    `json:"client"`
	Op     string  `json:"op"`
	Key    *string `json:"key"`
	Input  *int64  `json:"input"`
	Output *int64  `json:"output"`
	Call   *int64  `json:"call"`
	Return *int64  `json:"return"`
}

func parseLine(text string) (op, error) {
	var l line
	dec := json.NewDecoder(strings.NewReader(text))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		return op{}, err
	}
	if dec.More() {
		return op{}, fmt.Errorf("more than one JSON value")
	}
	switch {
	case l.Client == nil || *l.Client < 0:
		return op{}, fmt.Errorf("missing or negative \"client\"")
	case l.Op != "get" && l.Op != "put" && l.Op != "rmw":
		return op{}, fmt.Errorf("\"op\" is %q, not get, put or rmw", l.Op)
	case l.Key == nil || *l.Key == "":
		return op{}, fmt.Errorf("missing \"key\"")
	case l.Op == "put" && l.Input == nil:
		return op{}, fmt.Errorf("put without \"input\"")
	case l.Op != "put" && l.Output == nil:
		return op{}, fmt.Errorf("%s without \"output\"", l.Op)
	case l.Call == nil || l.Return == nil:
		return op{}, fmt.Errorf("missing \"call\" or \"return\"")
	case *l.Return < *l.Call:
		return op{}, fmt.Errorf("returns before its call")
	}
	o := op{client: *l.Client, kind: l.Op, key: *l.Key,
		call: *l.Call, ret: *l.Return}
	if l.Input != nil {
		o.input = *l.Input
	}
	if l.Output != nil {
		o.output = *l.Output
	}
	return o, nil
}

func readHistory(r io.Reader) ([]op, error) {
	var ops []op
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		o, err := parseLine(sc.Text())
		if err != nil {
			return nil, fmt.Errorf("line %d: %v", n, err)
		}
		ops = append(ops, o)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(ops) == 0 {
		return nil, fmt.Errorf("no operations")
	}
	return ops, nil
}

// step applies o to a register holding state.
func step(state int64, o op) (bool, int64) {
	switch o.kind {
	case "put":
		return true, o.input
	case "rmw":
		return o.output == state, state + 1
	default:
		return o.output == state, state
	}
}

// byKey partitions the history per key, keys in sorted order.
func byKey(history []porcupine.Operation) [][]porcupine.Operation {
	parts := map[string][]porcupine.Operation{}
	for _, h := range history {
		k := h.Input.(op).key
		parts[k] = append(parts[k], h)
	}
	keys := make([]string, 0, len(parts))
	for k := range parts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([][]porcupine.Operation, len(keys))
	for i, k := range keys {
		out[i] = parts[k]
	}
	return out
}

var model = porcupine.Model{
	Partition: byKey,
	Init:      func() interface{} { return int64(0) },
	Step: func(state, input, output interface{}) (bool, interface{}) {
		return step(state.(int64), input.(op))
	},
}

func describe(o op, t0 int64) string {
	var what string
	switch o.kind {
	case "put":
		what = fmt.Sprintf("put %s %d", o.key, o.input)
	default:
		what = fmt.Sprintf("%s %s -> %d", o.kind, o.key, o.output)
	}
	return fmt.Sprintf("client %d %s [t=%.3f..%.3f ms]", o.client, what,
		float64(o.call-t0)/1e6, float64(o.ret-t0)/1e6)
}

// explain describes a key whose history is not linearizable: the state
// after its longest linearizable prefix, and the operations that could come
// next, none of which fits.
func explain(w io.Writer, part []porcupine.Operation, partials [][]int, t0 int64) {
	var prefix []int
	for _, p := range partials {
		if len(p) > len(prefix) {
			prefix = p
		}
	}
	state, done := int64(0), make([]bool, len(part))
	for _, id := range prefix {
		_, state = step(state, part[id].Input.(op))
		done[id] = true
	}
	first := int64(-1) // the earliest return among the rest
	for id, h := range part {
		if !done[id] && (first < 0 || h.Return < first) {
			first = h.Return
		}
	}
	key := part[0].Input.(op).key
	fmt.Fprintf(w, "key %s is not linearizable: %d of %d operations "+
		"linearize, leaving %d, and none of these can come next:\n",
		key, len(prefix), len(part), state)
	if len(prefix) > 0 {
		fmt.Fprintf(w, "  after %s\n",
			describe(part[prefix[len(prefix)-1]].Input.(op), t0))
	}
	listed := 0
	for id, h := range part {
		if done[id] || h.Call > first {
			continue
		}
		if listed++; listed > maxListed {
			fmt.Fprintf(w, "  ...\n")
			break
		}
		fmt.Fprintf(w, "  %s\n", describe(h.Input.(op), t0))
	}
}

func check(w io.Writer, ops []op, timeout time.Duration) porcupine.CheckResult {
	history := make([]porcupine.Operation, len(ops))
	clients := map[int]bool{}
	t0 := ops[0].call
	for i, o := range ops {
		history[i] = porcupine.Operation{ClientId: o.client, Input: o,
			Call: o.call, Output: o.output, Return: o.ret}
		clients[o.client] = true
		if o.call < t0 {
			t0 = o.call
		}
	}
	res, info := porcupine.CheckOperationsVerbose(model, history, timeout)
	parts := byKey(history)
	switch res {
	case porcupine.Ok:
		fmt.Fprintf(w, "linearizable: %d operations, %d keys, %d clients\n",
			len(ops), len(parts), len(clients))
	case porcupine.Illegal:
		var bad []int
		for p, partials := range info.PartialLinearizations() {
			full := false
			for _, l := range partials {
				full = full || len(l) == len(parts[p])
			}
			if !full {
				bad = append(bad, p)
			}
		}
		if len(bad) == 0 { // cannot happen: a failing key has no full one
			fmt.Fprintf(w, "not linearizable\n")
			break
		}
		explain(w, parts[bad[0]], info.PartialLinearizations()[bad[0]], t0)
		if len(bad) > 1 {
			var others []string
			for _, p := range bad[1:] {
				others = append(others, parts[p][0].Input.(op).key)
			}
			fmt.Fprintf(w, "(not linearizable either: %s)\n",
				strings.Join(others, ", "))
		}
	default:
		fmt.Fprintf(w, "undecided: no answer within %v for %d operations\n",
			timeout, len(ops))
	}
	return res
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("linearizability", flag.ContinueOnError)
	fs.SetOutput(stderr)
	timeout := fs.Duration("timeout", 30*time.Second, "give up after this long")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: linearizability [-timeout 30s] HISTORY.jsonl\n")
		fs.PrintDefaults()
	}
	if fs.Parse(args) != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	f, err := os.Open(fs.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "linearizability: %v\n", err)
		return 2
	}
	defer f.Close()
	ops, err := readHistory(f)
	if err != nil {
		fmt.Fprintf(stderr, "linearizability: %s: %v\n", fs.Arg(0), err)
		return 2
	}
	switch check(stdout, ops, *timeout) {
	case porcupine.Ok:
		return 0
	case porcupine.Illegal:
		return 1
	default:
		return 3
	}
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}
