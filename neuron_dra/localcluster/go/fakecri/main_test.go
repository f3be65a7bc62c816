package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeSpec(t *testing.T, dir, name, text string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestResolveCDI(t *testing.T) {
	dir := t.TempDir()
	writeSpec(t, dir, "neuron_a.json", `{"cdiVersion":"0.5.0","kind":"aws.amazon.com/neuron",
		"containerEdits":{"env":["SPEC=1"]},
		"devices":[{"name":"a-dev-0","containerEdits":{"env":["X=0"],"deviceNodes":[{"path":"/dev/neuron0"}]}},
		           {"name":"a-req","containerEdits":{"env":["REQ=r"]}}]}`)
	writeSpec(t, dir, "other.yaml", "cdiVersion: 0.3.0\nkind: example.com/net\ndevices:\n- name: a-dev-0\n  containerEdits:\n    env: [NET=1]\n")
	writeSpec(t, dir, ".neuron_b.json.tmp", `{"kind":"aws.amazon.com/neuron","devices":[{"name":"b"}]}`)

	// The same id twice (kubelet passes a per-request id once per device): resolved each time.
	got, err := resolveCDI(dir, []string{"aws.amazon.com/neuron=a-dev-0", "aws.amazon.com/neuron=a-req",
		"aws.amazon.com/neuron=a-req", "example.com/net=a-dev-0"})
	if err != nil {
		t.Fatalf("resolve: %v", err)
	}
	want := "SPEC=1,X=0,SPEC=1,REQ=r,SPEC=1,REQ=r,NET=1"
	if strings.Join(got.env, ",") != want {
		t.Errorf("env %v, want %s", got.env, want)
	}
	if len(got.deviceNodes) != 1 || got.deviceNodes[0]["path"] != "/dev/neuron0" {
		t.Errorf("device nodes %v", got.deviceNodes)
	}

	for _, bad := range []string{"aws.amazon.com/neuron=b", "aws.amazon.com/neuron=missing", "neuron=a-dev-0", "aws.amazon.com/neuron"} {
		if _, err := resolveCDI(dir, []string{bad}); err == nil {
			t.Errorf("%q resolved; want an error", bad)
		}
	}
	// A device defined twice is ambiguous, as for a CDI registry.
	writeSpec(t, dir, "neuron_dup.json", `{"kind":"aws.amazon.com/neuron","devices":[{"name":"a-req"}]}`)
	if _, err := resolveCDI(dir, []string{"aws.amazon.com/neuron=a-req"}); err == nil || !strings.Contains(err.Error(), "2 matching") {
		t.Errorf("duplicate device: err %v", err)
	}
	if got, err := resolveCDI(filepath.Join(dir, "absent"), nil); err != nil || len(got.env) != 0 {
		t.Errorf("no ids need no directory: %v %v", got, err)
	}
}
