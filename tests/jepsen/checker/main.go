// Command checker judges a history of register operations for
// linearizability with Porcupine. It knows only the model (one register per
// integer key: put, get, remove, append) and the history: nothing of the
// system under test.
//
// Input: one JSON object per line (see Record). Operations whose outcome is
// "fail" definitely did not happen and are dropped; "info" writes may have
// happened at any time after their call (no return time); "info" reads tell
// nothing and are dropped.
//
// Usage: checker [-html FILE] [-timeout SECONDS] [-context N] [-show N] HISTORY.jsonl
//
// Exit status: 0 linearizable, 1 not linearizable (or the check could not
// finish in time: a history that cannot be shown correct is not passed),
// 2 bad input.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// Record is one line of the history.
type Record struct {
	Process int    `json:"process"` // the client thread; one operation at a time
	Key     int64  `json:"key"`
	F       string `json:"f"`     // put | get | remove | append
	Value   string `json:"value"` // put, append: the bytes written
	Type    string `json:"type"`  // ok | fail | info
	Call    int64  `json:"call"`  // CLOCK_MONOTONIC ns at invocation
	Ret     int64  `json:"ret"`   // CLOCK_MONOTONIC ns at completion (ok, fail)
	Found   bool   `json:"found"` // get: the key existed; remove: it returned true
	Out     string `json:"out"`   // get: the value read when found
	Member  string `json:"member"`
	Error   string `json:"error"`
}

// Input of the model.
type Input struct {
	F     string
	Key   int64
	Value string
}

// Output of the model.
type Output struct {
	Found   bool
	Value   string
	Unknown bool // an operation in doubt: its result says nothing
}

// State of one register: absent, or present with a value.
type State struct {
	Present bool
	Value   string
}

// Step is the sequential specification of one key's register.
func Step(state interface{}, in interface{}, out interface{}) (bool, interface{}) {
	s := state.(State)
	i := in.(Input)
	o := out.(Output)
	switch i.F {
	case "put":
		return true, State{true, i.Value}
	case "append":
		if s.Present {
			return true, State{true, s.Value + i.Value}
		}
		return true, State{true, i.Value}
	case "remove":
		return o.Unknown || o.Found == s.Present, State{}
	case "get":
		if !s.Present {
			return !o.Found, s
		}
		return o.Found && o.Value == s.Value, s
	}
	return false, s
}

// Model partitions the history by key.
var Model = porcupine.Model{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[int64][]porcupine.Operation{}
		var keys []int64
		for _, op := range h {
			k := op.Input.(Input).Key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		sort.Slice(keys, func(a, b int) bool { return keys[a] < keys[b] })
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init:  func() interface{} { return State{} },
	Step:  Step,
	Equal: func(a, b interface{}) bool { return a.(State) == b.(State) },
	DescribeOperation: func(in interface{}, out interface{}) string {
		i := in.(Input)
		o := out.(Output)
		switch i.F {
		case "put", "append":
			return fmt.Sprintf("%s(%d, %q)", i.F, i.Key, short(i.Value))
		case "remove":
			if o.Unknown {
				return fmt.Sprintf("remove(%d) -> ?", i.Key)
			}
			return fmt.Sprintf("remove(%d) -> %v", i.Key, o.Found)
		}
		if !o.Found {
			return fmt.Sprintf("get(%d) -> absent", i.Key)
		}
		return fmt.Sprintf("get(%d) -> %q", i.Key, short(o.Value))
	},
	DescribeState: func(s interface{}) string {
		st := s.(State)
		if !st.Present {
			return "absent"
		}
		return fmt.Sprintf("%q", short(st.Value))
	},
}

func short(s string) string {
	if len(s) > 48 {
		return "…" + s[len(s)-47:]
	}
	return s
}

// Operations turns records into Porcupine operations (see the package
// comment for what is dropped) and returns them with the record each came
// from.
func Operations(recs []Record) ([]porcupine.Operation, []Record) {
	var ops []porcupine.Operation
	var kept []Record
	for _, r := range recs {
		if r.Type == "fail" {
			continue
		}
		isRead := r.F == "get"
		if r.Type == "info" && isRead {
			continue
		}
		ret := r.Ret
		if r.Type == "info" {
			ret = math.MaxInt64
		}
		out := Output{Found: r.Found, Value: r.Out}
		if r.Type == "info" {
			out = Output{Unknown: true} // a remove in doubt matches either state
		}
		ops = append(ops, porcupine.Operation{
			ClientId: r.Process,
			Input:    Input{F: r.F, Key: r.Key, Value: r.Value},
			Call:     r.Call,
			Output:   out,
			Return:   ret,
			Metadata: r.Member,
		})
		kept = append(kept, r)
	}
	return ops, kept
}

// ReadHistory parses the JSON lines of r.
func ReadHistory(r io.Reader) ([]Record, error) {
	var recs []Record
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			continue
		}
		var rec Record
		dec := json.NewDecoder(strings.NewReader(text))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&rec); err != nil {
			return nil, fmt.Errorf("line %d: %v", line, err)
		}
		switch rec.F {
		case "put", "get", "remove", "append":
		default:
			return nil, fmt.Errorf("line %d: unknown f %q", line, rec.F)
		}
		switch rec.Type {
		case "ok", "fail":
			if rec.Ret < rec.Call {
				return nil, fmt.Errorf("line %d: returns before its call", line)
			}
		case "info":
		default:
			return nil, fmt.Errorf("line %d: unknown type %q", line, rec.Type)
		}
		recs = append(recs, rec)
	}
	return recs, sc.Err()
}

// Result of checking one key.
type Result struct {
	Key    int64
	Ops    int
	Result porcupine.CheckResult
	Info   porcupine.LinearizationInfo
	ops    []porcupine.Operation
}

// CheckKeys checks every key on its own (so a violation names its key),
// as many at once as there are CPUs: first each with a short budget, then
// the keys that needed more, one after another, until "timeout" is spent
// (a key not decided by then is Unknown). A few keys with many operations
// in doubt thus cannot starve the others.
func CheckKeys(ops []porcupine.Operation, timeout time.Duration) []Result {
	parts := Model.Partition(ops)
	res := make([]Result, len(parts))
	deadline := time.Now().Add(timeout)
	check := func(i int, budget time.Duration) {
		single := Model
		single.Partition = nil
		r, info := porcupine.Unknown, porcupine.LinearizationInfo{}
		if budget > 0 {
			r, info = porcupine.CheckOperationsVerbose(single, parts[i], budget)
		}
		res[i] = Result{Key: parts[i][0].Input.(Input).Key, Ops: len(parts[i]), Result: r, Info: info, ops: parts[i]}
	}
	first := timeout / 20
	if first > 5*time.Second {
		first = 5 * time.Second
	}
	sem := make(chan struct{}, runtime.NumCPU())
	var wg sync.WaitGroup
	for i := range parts {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			check(i, first)
		}(i)
	}
	wg.Wait()
	for i := range parts {
		if res[i].Result == porcupine.Unknown {
			check(i, time.Until(deadline))
		}
	}
	return res
}

// FailingPiece returns the operations of a failing key around the point
// where every linearization stops: the last few operations of the longest
// partial linearization and every operation that overlaps the interval
// from them to the first completed operation that none could place, in
// call order, and the register's state before them.
func FailingPiece(r Result, context int) (string, []porcupine.Operation) {
	var longest []porcupine.Operation
	for _, seqs := range r.Info.PartialLinearizationsOperations() {
		for _, s := range seqs {
			if len(s) > len(longest) {
				longest = s
			}
		}
	}
	type opID struct{ call, client int64 }
	placed := map[opID]bool{} // one operation at a time per client
	keyOf := func(op porcupine.Operation) opID { return opID{op.Call, int64(op.ClientId)} }
	for _, op := range longest {
		placed[keyOf(op)] = true
	}
	// The first operation (by return) that could not be placed.
	var stuck *porcupine.Operation
	for i := range r.ops {
		op := &r.ops[i]
		if placed[keyOf(*op)] || op.Return == math.MaxInt64 {
			continue
		}
		if stuck == nil || op.Return < stuck.Return {
			stuck = op
		}
	}
	state := interface{}(State{})
	from := 0
	if len(longest) > context {
		from = len(longest) - context
	}
	for _, op := range longest[:from] {
		_, state = Step(state, op.Input, op.Output)
	}
	lo := int64(math.MaxInt64)
	for _, op := range longest[from:] {
		if op.Call < lo {
			lo = op.Call
		}
	}
	hi := lo
	if stuck != nil {
		hi = stuck.Return
		if stuck.Call < lo {
			lo = stuck.Call
		}
	}
	var piece []porcupine.Operation
	for _, op := range r.ops {
		if op.Call <= hi && op.Return >= lo {
			piece = append(piece, op)
		}
	}
	sort.Slice(piece, func(a, b int) bool { return piece[a].Call < piece[b].Call })
	return Model.DescribeState(state), piece
}

func main() {
	html := flag.String("html", "", "write Porcupine's visualization of a violation here")
	timeout := flag.Float64("timeout", 300, "seconds for the whole check; keys not done by then are unknown")
	ctx := flag.Int("context", 4, "operations of the longest linearization to show before a violation")
	show := flag.Int("show", 3, "failing keys whose piece of history is printed")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: checker [-html FILE] [-timeout S] [-context N] HISTORY.jsonl")
		os.Exit(2)
	}
	f, err := os.Open(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	recs, err := ReadHistory(f)
	f.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bad history:", err)
		os.Exit(2)
	}
	ops, _ := Operations(recs)
	t0 := time.Now()
	results := CheckKeys(ops, time.Duration(*timeout*float64(time.Second)))
	bad, unknown := 0, 0
	var counts []string
	for _, r := range results {
		counts = append(counts, fmt.Sprintf("%d:%d", r.Key, r.Ops))
		switch r.Result {
		case porcupine.Illegal:
			bad++
		case porcupine.Unknown:
			unknown++
		}
	}
	fmt.Printf("operations %d (of %d records), keys %d, checked in %.2f s\n", len(ops), len(recs),
		len(results), time.Since(t0).Seconds())
	if len(counts) <= 20 {
		fmt.Printf("per key: %s\n", strings.Join(counts, " "))
	} else {
		sizes := make([]int, len(results))
		for i, r := range results {
			sizes[i] = r.Ops
		}
		sort.Ints(sizes)
		fmt.Printf("per key: %d keys, operations min %d median %d max %d\n", len(sizes), sizes[0],
			sizes[len(sizes)/2], sizes[len(sizes)-1])
	}
	if bad == 0 && unknown == 0 {
		fmt.Println("linearizable")
		os.Exit(0)
	}
	base := int64(math.MaxInt64) // times are printed from the first call
	for _, op := range ops {
		if op.Call < base {
			base = op.Call
		}
	}
	// Every failing key goes into the visualization; the shortest pieces
	// (at most -show of them) are printed.
	var failing []porcupine.Operation
	type shown struct {
		r     Result
		state string
		piece []porcupine.Operation
	}
	var pieces []shown
	for _, r := range results {
		if r.Result == porcupine.Unknown {
			fmt.Printf("key %d: not checked within %.0f s (%d operations; not shown linearizable)\n", r.Key, *timeout, r.Ops)
			continue
		}
		if r.Result != porcupine.Illegal {
			continue
		}
		failing = append(failing, r.ops...)
		state, piece := FailingPiece(r, *ctx)
		pieces = append(pieces, shown{r, state, piece})
	}
	sort.SliceStable(pieces, func(a, b int) bool { return len(pieces[a].piece) < len(pieces[b].piece) })
	for i, p := range pieces {
		if i == *show {
			fmt.Printf("(%d more keys not linearizable; -show N prints more)\n", len(pieces)-i)
			break
		}
		fmt.Printf("key %d: NOT linearizable (%d operations); state %s, then:\n", p.r.Key, p.r.Ops, p.state)
		for _, op := range p.piece {
			ret := "        ?"
			if op.Return != math.MaxInt64 {
				ret = fmt.Sprintf("%9.6f", float64(op.Return-base)/1e9)
			}
			fmt.Printf("  [%9.6f, %s] p%-5d %-18s %s\n", float64(op.Call-base)/1e9, ret, op.ClientId,
				op.Metadata, Model.DescribeOperation(op.Input, op.Output))
		}
	}
	if *html != "" && len(failing) > 0 {
		// Only the failing keys: a page of every key would be unreadable.
		_, info := porcupine.CheckOperationsVerbose(Model, failing, time.Duration(*timeout*float64(time.Second)))
		if err := porcupine.VisualizePath(Model, info, *html); err != nil {
			fmt.Fprintln(os.Stderr, "visualization:", err)
		} else {
			fmt.Printf("visualization: %s\n", *html)
		}
	}
	if bad > 0 {
		fmt.Printf("NOT linearizable: %d of %d keys\n", bad, len(results))
	} else {
		fmt.Printf("UNKNOWN: %d keys could not be checked in time\n", unknown)
	}
	os.Exit(1)
}
