// Command allocsim runs kube-scheduler's structured DRA allocator on cases read from stdin, so
// the project's Python allocation simulation can be compared with the real thing.
//
// Input (stdin):  {"cases": [{"id", "slices", "deviceClasses", "claims", "allocated",
//
//	"nodeName", "nodeLabels", "mode", "timeoutSeconds"}]}
//
// Output (stdout): {"results": [{"id", "satisfiable", "count", "allocation", "error", "nanos"}]}
//
// Modes:
//   - "fit-one": allocate all claims together on the node; allocation holds one list of device
//     results per claim, in claim order.
//   - "count": allocate copies of claims[0] one after another (each result added to the allocated
//     set, as the scheduler's claim tracker does), up to 64; allocation holds one list per copy.
//
// Each case is decoded strictly (unknown fields are an error of that case), so a typo on the
// Python side shows up as an error instead of a silently different input.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"
)

// countCap bounds mode "count": enough for any node this project models (at most 16 devices + 128 NeuronCores).
const countCap = 256

// defaultTimeout mirrors kube-scheduler's DRA filter timeout (DRASchedulerFilterTimeout, beta and on
// in 1.34; FilterTimeout default 10 s), applied to each allocation like to each Filter call.
const defaultTimeout = 10 * time.Second

type deviceRef struct {
	Driver string `json:"driver"`
	Pool   string `json:"pool"`
	Device string `json:"device"`
}

type inputCase struct {
	ID             string                       `json:"id"`
	Slices         []*resourceapi.ResourceSlice `json:"slices"`
	DeviceClasses  []*resourceapi.DeviceClass   `json:"deviceClasses"`
	Claims         []*resourceapi.ResourceClaim `json:"claims"`
	Allocated      []deviceRef                  `json:"allocated"`
	NodeName       string                       `json:"nodeName"`
	NodeLabels     map[string]string            `json:"nodeLabels"`
	Mode           string                       `json:"mode"`
	TimeoutSeconds float64                      `json:"timeoutSeconds"`
}

type resultDevice struct {
	Request string `json:"request"`
	Driver  string `json:"driver"`
	Pool    string `json:"pool"`
	Device  string `json:"device"`
}

type result struct {
	ID          string           `json:"id"`
	Satisfiable bool             `json:"satisfiable"`
	Count       int              `json:"count"`
	Allocation  [][]resultDevice `json:"allocation"`
	Error       string           `json:"error"`
	Nanos       int64            `json:"nanos"`
}

// classLister answers like the scheduler's informer-backed lister: NotFound for unknown classes.
type classLister map[string]*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(l))
	for _, c := range l {
		out = append(out, c)
	}
	return out, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := l[name]; ok {
		return c, nil
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("deviceclasses"), name)
}

// features are kube-scheduler 1.36's defaults (pkg/scheduler/framework/plugins/dynamicresources,
// allocatorFeatures): DRAAdminAccess and DRAPrioritizedList GA; DRAPartitionableDevices,
// DRADeviceTaints, DRAConsumableCapacity, DRADeviceBindingConditions and
// DRAResourceClaimDeviceStatus beta and on; DRAListTypeAttributes alpha and off.
var features = structured.Features{
	AdminAccess:            true,
	ConsumableCapacity:     true,
	DeviceBindingAndStatus: true,
	DeviceTaints:           true,
	PartitionableDevices:   true,
	PrioritizedList:        true,
}

// celCache is shared by all cases like the scheduler plugin's single cache (same size).
var celCache = cel.NewCache(10, cel.Features{EnableConsumableCapacity: features.ConsumableCapacity})

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "allocsim: %v\n", err)
		os.Exit(1)
	}
}

func run(in io.Reader, out io.Writer) error {
	var input struct {
		Cases []json.RawMessage `json:"cases"`
	}
	dec := json.NewDecoder(in)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&input); err != nil {
		return fmt.Errorf("decode input: %w", err)
	}
	results := make([]result, 0, len(input.Cases))
	for i, raw := range input.Cases {
		results = append(results, runRaw(i, raw))
	}
	enc := json.NewEncoder(out)
	return enc.Encode(map[string][]result{"results": results})
}

func runRaw(index int, raw json.RawMessage) result {
	var c inputCase
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		var probe struct {
			ID string `json:"id"`
		}
		_ = json.Unmarshal(raw, &probe)
		return result{ID: probe.ID, Error: fmt.Sprintf("case %d: decode: %v", index, err), Allocation: [][]resultDevice{}}
	}
	res := runCase(c)
	res.ID = c.ID
	return res
}

func runCase(c inputCase) result {
	res := result{Allocation: [][]resultDevice{}}
	if len(c.Claims) == 0 {
		res.Error = "no claims"
		return res
	}
	if c.NodeName == "" {
		res.Error = "nodeName is empty"
		return res
	}
	classes := classLister{}
	for _, class := range c.DeviceClasses {
		classes[class.Name] = class
	}
	labels := map[string]string{"kubernetes.io/hostname": c.NodeName}
	for k, v := range c.NodeLabels {
		labels[k] = v
	}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: c.NodeName, Labels: labels}}
	allocated := sets.New[structured.DeviceID]()
	for _, d := range c.Allocated {
		allocated.Insert(structured.MakeDeviceID(d.Driver, d.Pool, d.Device))
	}
	for i, claim := range c.Claims {
		defaultClaimMeta(claim, i)
		defaultClaimSpec(claim)
	}
	timeout := defaultTimeout
	if c.TimeoutSeconds > 0 {
		timeout = time.Duration(c.TimeoutSeconds * float64(time.Second))
	}
	started := time.Now()
	switch c.Mode {
	case "fit-one", "":
		results, err := allocate(timeout, allocated, classes, c.Slices, node, c.Claims)
		if err != nil {
			res.Error = err.Error()
		} else if results != nil {
			res.Satisfiable = true
			res.Count = 1
			for i := range results {
				res.Allocation = append(res.Allocation, devicesOf(&results[i]))
			}
		}
	case "count":
		for res.Count < countCap {
			claim := c.Claims[0].DeepCopy()
			claim.Name = fmt.Sprintf("%s-%d", c.Claims[0].Name, res.Count)
			claim.UID = types.UID(fmt.Sprintf("%s-%d", c.Claims[0].UID, res.Count))
			results, err := allocate(timeout, allocated, classes, c.Slices, node, []*resourceapi.ResourceClaim{claim})
			if err != nil {
				res.Error = err.Error()
				break
			}
			if results == nil {
				break
			}
			res.Count++
			res.Allocation = append(res.Allocation, devicesOf(&results[0]))
			for _, r := range results[0].Devices.Results {
				// The scheduler's claim tracker does not count admin-access results as allocated.
				if !ptr.Deref(r.AdminAccess, false) {
					allocated.Insert(structured.MakeDeviceID(r.Driver, r.Pool, r.Device))
				}
			}
		}
		res.Satisfiable = res.Count > 0
	default:
		res.Error = fmt.Sprintf("unknown mode %q (want fit-one or count)", c.Mode)
	}
	res.Nanos = time.Since(started).Nanoseconds()
	return res
}

// allocate is what the scheduler's PreFilter + Filter do for one pod and node: a fresh allocator
// over the current allocated set and all slices, then Allocate for the node, bounded by the
// filter timeout. A timeout is reported as an error starting with "timeout:"; the scheduler treats
// it as "unschedulable on this node".
func allocate(timeout time.Duration, allocated sets.Set[structured.DeviceID], classes classLister,
	slices []*resourceapi.ResourceSlice, node *v1.Node, claims []*resourceapi.ResourceClaim,
) ([]resourceapi.AllocationResult, error) {
	state := structured.AllocatedState{
		AllocatedDevices:         allocated.Clone(),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	allocator, err := structured.NewAllocator(ctx, features, state, classes, slices, celCache)
	if err != nil {
		return nil, fmt.Errorf("NewAllocator: %w", err)
	}
	results, err := allocator.Allocate(ctx, node, claims)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("timeout: %w", err)
		}
		return nil, err
	}
	return results, nil
}

func devicesOf(r *resourceapi.AllocationResult) []resultDevice {
	out := make([]resultDevice, 0, len(r.Devices.Results))
	for _, d := range r.Devices.Results {
		out = append(out, resultDevice{Request: d.Request, Driver: d.Driver, Pool: d.Pool, Device: d.Device})
	}
	return out
}

// defaultClaimMeta fills what a claim read from the API server always has, because the cases only
// need a spec.
func defaultClaimMeta(claim *resourceapi.ResourceClaim, index int) {
	if claim.Name == "" {
		claim.Name = fmt.Sprintf("claim-%d", index)
	}
	if claim.Namespace == "" {
		claim.Namespace = "default"
	}
	if claim.UID == "" {
		claim.UID = types.UID(fmt.Sprintf("uid-%s-%d", claim.Name, index))
	}
}

// defaultClaimSpec applies the API server's defaulting of resource.k8s.io/v1 requests
// (pkg/apis/resource/v1/defaults.go at 1.34), which the allocator relies on and a case written by
// hand or by the Python side may leave out.
func defaultClaimSpec(claim *resourceapi.ResourceClaim) {
	for i := range claim.Spec.Devices.Requests {
		request := &claim.Spec.Devices.Requests[i]
		if request.Exactly != nil {
			defaultMode(&request.Exactly.AllocationMode, &request.Exactly.Count)
		}
		for j := range request.FirstAvailable {
			sub := &request.FirstAvailable[j]
			defaultMode(&sub.AllocationMode, &sub.Count)
		}
	}
}

func defaultMode(mode *resourceapi.DeviceAllocationMode, count *int64) {
	if *mode == "" {
		*mode = resourceapi.DeviceAllocationModeExactCount
	}
	if *mode == resourceapi.DeviceAllocationModeExactCount && *count == 0 {
		*count = 1
	}
}
