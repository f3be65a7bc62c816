// fakecri: a CRI v1 runtime that runs no containers, for the local cluster's real kubelets.
//
// It wraps the in-tree fake runtime k8s.io/cri-client/pkg/fake (sandboxes and containers are
// in-memory records) and adds what the local cluster needs (docs/real-kubelet.md):
//   - a non-zero image size (kubelet refuses an image without one: "Id or size of image ... is not set");
//   - a LogPath on every container, with an empty file there (kubelet stats it every few seconds);
//   - CreateContainer resolves every CDI device id kubelet passes (ContainerConfig.CDIDevices)
//     against the spec files in --cdi-dir, as containerd does, and fails the container on an id
//     that no spec defines exactly once;
//   - one JSON line per CreateContainer (ids as passed, resolved env and device nodes, or the error)
//     and per RemovePodSandbox appended to --record, which the demo and the tests read.
//
// CRI v1 is the same wire API for every kubelet minor this project runs (1.34-1.37).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	kubeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
	"sigs.k8s.io/yaml"
)

// fakeImageSize: any non-zero value; 100 MiB looks like a small real image.
const fakeImageSize = 100 << 20

type runtime struct {
	*fake.RemoteRuntime
	cdiDir  string
	records *recorder
}

type recorder struct {
	mu   sync.Mutex
	file *os.File
}

func (r *recorder) write(entry map[string]any) {
	entry["time"] = time.Now().UTC().Format(time.RFC3339Nano)
	line, err := json.Marshal(entry)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fakecri: record not written: %v\n", err)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.file.Write(append(line, '\n')); err != nil {
		fmt.Fprintf(os.Stderr, "fakecri: record not written: %v\n", err)
	}
}

// cdiSpec holds the parts of a CDI spec file that resolution needs.
type cdiSpec struct {
	Kind           string         `json:"kind"`
	ContainerEdits containerEdits `json:"containerEdits"`
	Devices        []struct {
		Name           string         `json:"name"`
		ContainerEdits containerEdits `json:"containerEdits"`
	} `json:"devices"`
}

type containerEdits struct {
	Env         []string         `json:"env"`
	DeviceNodes []map[string]any `json:"deviceNodes"`
}

type resolved struct {
	env         []string
	deviceNodes []map[string]any
}

// resolveCDI resolves fully qualified ids (vendor/class=name) as a CDI registry does: each must
// name exactly one device among the spec files (.json, .yaml, .yml; names starting with '.' are
// skipped, as temporary files of atomic writes are). Spec-level edits come before device edits.
func resolveCDI(dir string, ids []string) (resolved, error) {
	var out resolved
	if len(ids) == 0 {
		return out, nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return out, fmt.Errorf("CDI directory %s: %w", dir, err)
	}
	specs := map[string]cdiSpec{}
	names := []string{}
	for _, e := range entries {
		ext := filepath.Ext(e.Name())
		if e.IsDir() || strings.HasPrefix(e.Name(), ".") || (ext != ".json" && ext != ".yaml" && ext != ".yml") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		data, err := os.ReadFile(path)
		if err != nil {
			if os.IsNotExist(err) {
				continue // removed since the listing
			}
			return out, err
		}
		var spec cdiSpec
		if err := yaml.Unmarshal(data, &spec); err != nil {
			return out, fmt.Errorf("CDI spec %s: %w", path, err)
		}
		specs[path] = spec
		names = append(names, path)
	}
	sort.Strings(names)
	for _, id := range ids {
		kind, name, ok := strings.Cut(id, "=")
		if !ok || !strings.Contains(kind, "/") || name == "" {
			return out, fmt.Errorf("%q is not a fully qualified CDI device id (vendor/class=name)", id)
		}
		var found []string
		var edits []containerEdits
		for _, path := range names {
			spec := specs[path]
			if spec.Kind != kind {
				continue
			}
			for _, dev := range spec.Devices {
				if dev.Name == name {
					found = append(found, path)
					edits = []containerEdits{spec.ContainerEdits, dev.ContainerEdits}
				}
			}
		}
		if len(found) != 1 {
			return out, fmt.Errorf("unresolvable CDI devices %s: %d matching devices in %s %v", id, len(found), dir, found)
		}
		for _, e := range edits {
			out.env = append(out.env, e.Env...)
			out.deviceNodes = append(out.deviceNodes, e.DeviceNodes...)
		}
	}
	return out, nil
}

func podOf(sandbox *kubeapi.PodSandboxConfig) map[string]string {
	m := sandbox.GetMetadata()
	return map[string]string{"namespace": m.GetNamespace(), "name": m.GetName(), "uid": m.GetUid()}
}

// envMap: the container's own env, then the CDI edits (later entries win, as runtimes apply them).
func envMap(config *kubeapi.ContainerConfig, cdiEnv []string) map[string]string {
	env := map[string]string{}
	for _, kv := range config.GetEnvs() {
		env[kv.GetKey()] = string(kv.GetValue())
	}
	for _, item := range cdiEnv {
		k, v, _ := strings.Cut(item, "=")
		env[k] = v
	}
	return env
}

func (f *runtime) CreateContainer(ctx context.Context, req *kubeapi.CreateContainerRequest) (*kubeapi.CreateContainerResponse, error) {
	config := req.GetConfig()
	ids := []string{}
	for _, d := range config.GetCDIDevices() {
		ids = append(ids, d.GetName())
	}
	entry := map[string]any{
		"event":      "CreateContainer",
		"pod":        podOf(req.GetSandboxConfig()),
		"sandboxId":  req.GetPodSandboxId(),
		"container":  config.GetMetadata().GetName(),
		"attempt":    config.GetMetadata().GetAttempt(),
		"cdiDevices": ids,
	}
	res, err := resolveCDI(f.cdiDir, ids)
	if err != nil {
		entry["error"] = err.Error()
		f.records.write(entry)
		return nil, fmt.Errorf("failed to create containerd container: CDI device injection failed: %w", err)
	}
	resp, err := f.RemoteRuntime.CreateContainer(ctx, req)
	if err != nil {
		entry["error"] = err.Error()
		f.records.write(entry)
		return nil, err
	}
	entry["containerId"] = resp.ContainerId
	entry["env"] = envMap(config, res.env)
	if res.deviceNodes == nil {
		res.deviceNodes = []map[string]any{}
	}
	entry["deviceNodes"] = res.deviceNodes
	// A log file where kubelet looks for it (the sandbox's log directory + the container's path).
	logPath := filepath.Join(req.GetSandboxConfig().GetLogDirectory(), config.GetLogPath())
	if config.GetLogPath() != "" && filepath.IsAbs(logPath) {
		if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err == nil {
			if fh, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
				fh.Close()
			}
		}
		f.RuntimeService.Lock()
		if c, ok := f.RuntimeService.Containers[resp.ContainerId]; ok {
			c.LogPath = logPath
		}
		f.RuntimeService.Unlock()
	}
	f.records.write(entry)
	return resp, nil
}

func (f *runtime) RemovePodSandbox(ctx context.Context, req *kubeapi.RemovePodSandboxRequest) (*kubeapi.RemovePodSandboxResponse, error) {
	var pod map[string]string
	resp, err := f.PodSandboxStatus(ctx, &kubeapi.PodSandboxStatusRequest{PodSandboxId: req.GetPodSandboxId()})
	if err == nil && resp.GetStatus() != nil {
		m := resp.GetStatus().GetMetadata()
		pod = map[string]string{"namespace": m.GetNamespace(), "name": m.GetName(), "uid": m.GetUid()}
	}
	out, err := f.RemoteRuntime.RemovePodSandbox(ctx, req)
	if err == nil && pod != nil {
		f.records.write(map[string]any{"event": "RemovePodSandbox", "pod": pod, "sandboxId": req.GetPodSandboxId()})
	}
	return out, err
}

// forgetCalls keeps the fake's call log (one entry per CRI call, kept for unit-test assertions) from
// growing for the cluster's whole life.
func (f *runtime) forgetCalls() {
	for range time.Tick(time.Minute) {
		f.RuntimeService.Lock()
		f.RuntimeService.Called = nil
		f.RuntimeService.Unlock()
		f.ImageService.Lock()
		f.ImageService.Called = nil
		f.ImageService.Unlock()
	}
}

func main() {
	socket := flag.String("socket", "", "unix socket to serve CRI v1 on (removed first if present)")
	cdiDir := flag.String("cdi-dir", "", "the node's CDI spec directory")
	recordPath := flag.String("record", "", "file to append one JSON line per CreateContainer / RemovePodSandbox")
	flag.Parse()
	if *socket == "" || *cdiDir == "" || *recordPath == "" {
		fmt.Fprintln(os.Stderr, "fakecri: --socket, --cdi-dir and --record are required")
		os.Exit(2)
	}
	file, err := os.OpenFile(*recordPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fakecri: --record %s: %v\n", *recordPath, err)
		os.Exit(1)
	}
	f := &runtime{RemoteRuntime: fake.NewFakeRemoteRuntime(), cdiDir: *cdiDir, records: &recorder{file: file}}
	f.ImageService.SetFakeImageSize(fakeImageSize)
	f.RuntimeService.FakeStatus = &kubeapi.RuntimeStatus{Conditions: []*kubeapi.RuntimeCondition{
		{Type: kubeapi.RuntimeReady, Status: true},
		{Type: kubeapi.NetworkReady, Status: true},
	}}
	go f.forgetCalls()

	// Our own server: the one inside fake.RemoteRuntime is bound to its methods, not our overrides.
	server := grpc.NewServer()
	kubeapi.RegisterRuntimeServiceServer(server, f)
	kubeapi.RegisterImageServiceServer(server, f)
	if err := os.Remove(*socket); err != nil && !os.IsNotExist(err) {
		fmt.Fprintf(os.Stderr, "fakecri: removing stale %s: %v\n", *socket, err)
		os.Exit(1)
	}
	listener, err := net.Listen("unix", *socket)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fakecri: listen on %s: %v\n", *socket, err)
		os.Exit(1)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		server.Stop()
	}()
	fmt.Fprintf(os.Stderr, "fakecri: serving CRI v1 on %s (CDI specs from %s)\n", *socket, *cdiDir)
	if err := server.Serve(listener); err != nil {
		fmt.Fprintf(os.Stderr, "fakecri: %v\n", err)
	}
	os.Remove(*socket)
}
