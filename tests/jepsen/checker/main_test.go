package main

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

func check(t *testing.T, history string) []Result {
	t.Helper()
	recs, err := ReadHistory(strings.NewReader(history))
	if err != nil {
		t.Fatal(err)
	}
	ops, _ := Operations(recs)
	return CheckKeys(ops, 10*time.Second)
}

// Two clients; the read overlaps the put, and the later read sees it.
const linearizable = `
{"process":0,"key":1,"f":"put","value":"a","type":"ok","call":0,"ret":10}
{"process":0,"key":1,"f":"put","value":"b","type":"ok","call":20,"ret":40}
{"process":1,"key":1,"f":"get","type":"ok","call":25,"ret":30,"found":true,"out":"a"}
{"process":1,"key":1,"f":"get","type":"ok","call":50,"ret":60,"found":true,"out":"b"}
{"process":1,"key":1,"f":"append","value":"c","type":"ok","call":70,"ret":80}
{"process":0,"key":1,"f":"get","type":"ok","call":90,"ret":95,"found":true,"out":"bc"}
{"process":0,"key":1,"f":"remove","type":"ok","call":100,"ret":110,"found":true}
{"process":1,"key":1,"f":"get","type":"ok","call":120,"ret":130,"found":false}
{"process":2,"key":2,"f":"put","value":"x","type":"info","call":5}
{"process":3,"key":2,"f":"get","type":"ok","call":200,"ret":210,"found":true,"out":"x"}
{"process":3,"key":2,"f":"put","value":"y","type":"fail","call":220,"ret":230}
{"process":3,"key":2,"f":"get","type":"ok","call":240,"ret":250,"found":true,"out":"x"}
`

// A stale read: "b" was acknowledged at 40, a read that began at 50 still
// returns "a" (what a member that was replaced but still serves answers).
const stale = `
{"process":0,"key":1,"f":"put","value":"a","type":"ok","call":0,"ret":10}
{"process":0,"key":1,"f":"put","value":"b","type":"ok","call":20,"ret":40}
{"process":1,"key":1,"f":"get","type":"ok","call":50,"ret":60,"found":true,"out":"a","member":"10.77.0.13:9901"}
{"process":2,"key":7,"f":"put","value":"q","type":"ok","call":0,"ret":10}
`

func TestLinearizableHistoryPasses(t *testing.T) {
	for _, r := range check(t, linearizable) {
		if r.Result != porcupine.Ok {
			t.Errorf("key %d: %v, want ok", r.Key, r.Result)
		}
	}
}

func TestStaleReadIsCaught(t *testing.T) {
	res := check(t, stale)
	if len(res) != 2 || res[0].Key != 1 || res[0].Result != porcupine.Illegal || res[1].Result != porcupine.Ok {
		t.Fatalf("want key 1 illegal and key 7 ok, got %+v", res)
	}
	state, piece := FailingPiece(res[0], 4)
	if state != "absent" || len(piece) == 0 {
		t.Fatalf("state %s, piece %v", state, piece)
	}
	last := piece[len(piece)-1]
	if last.Input.(Input).F != "get" || last.Output.(Output).Value != "a" {
		t.Errorf("the piece should end with the stale get, got %v", Model.DescribeOperation(last.Input, last.Output))
	}
}

// A write whose outcome is unknown may take effect long after it was sent;
// a read of a value nobody wrote never passes.
func TestInDoubtWritesAndPhantoms(t *testing.T) {
	late := `
{"process":0,"key":3,"f":"put","value":"a","type":"ok","call":0,"ret":10}
{"process":1,"key":3,"f":"put","value":"z","type":"info","call":5}
{"process":0,"key":3,"f":"get","type":"ok","call":1000,"ret":1010,"found":true,"out":"a"}
{"process":0,"key":3,"f":"get","type":"ok","call":2000,"ret":2010,"found":true,"out":"z"}
`
	if r := check(t, late); r[0].Result != porcupine.Ok {
		t.Errorf("in-doubt write applied late: %v, want ok", r[0].Result)
	}
	// A remove in doubt on a key that stays absent: it may have run on
	// nothing (false) or never.
	removeInDoubt := `
{"process":0,"key":3,"f":"remove","type":"info","call":0}
{"process":1,"key":3,"f":"get","type":"ok","call":20,"ret":30,"found":false}
`
	if r := check(t, removeInDoubt); r[0].Result != porcupine.Ok {
		t.Errorf("remove in doubt on an absent key: %v, want ok", r[0].Result)
	}
	phantom := `
{"process":0,"key":3,"f":"put","value":"a","type":"ok","call":0,"ret":10}
{"process":0,"key":3,"f":"get","type":"ok","call":20,"ret":30,"found":true,"out":"nobody"}
`
	if r := check(t, phantom); r[0].Result != porcupine.Illegal {
		t.Errorf("phantom read: %v, want illegal", r[0].Result)
	}
	failed := `
{"process":0,"key":3,"f":"put","value":"a","type":"fail","call":0,"ret":10}
{"process":0,"key":3,"f":"get","type":"ok","call":20,"ret":30,"found":true,"out":"a"}
`
	if r := check(t, failed); r[0].Result != porcupine.Illegal {
		t.Errorf("a definitely failed write read back: %v, want illegal", r[0].Result)
	}
}

func TestBadInput(t *testing.T) {
	for _, h := range []string{
		`{"process":0,"key":1,"f":"cas","type":"ok","call":0,"ret":1}`,
		`{"process":0,"key":1,"f":"get","type":"maybe","call":0,"ret":1}`,
		`{"process":0,"key":1,"f":"get","type":"ok","call":5,"ret":1}`,
		`{"process":0,"key":1,"f":"get","type":"ok","call":0,"ret":1,"extra":1}`,
		`not json`,
	} {
		if _, err := ReadHistory(strings.NewReader(h)); err == nil {
			t.Errorf("accepted %s", h)
		}
	}
	_ = math.MaxInt64
}
