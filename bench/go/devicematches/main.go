// Command devicematches times cel.CompilationResult.DeviceMatches, the call kube-scheduler's DRA allocator makes
// for every selector and candidate device on every node it filters, on device variants read from stdin
// (bench/bench_device_matches.py writes them from the driver's own model).
//
// Input (stdin):  {"expressions": [str], "devices": [{"name", "driver", "attributes", "capacity"}],
//
//	"rounds": int, "iterations": int}
//
// Output (stdout): {"results": [{"name", "round", "evalsPerIteration", "cpuNanosPerEval", "bytesPerEval",
//
//	"allocsPerEval"}]}
//
// Each iteration evaluates the expressions in order until one is false (the allocator's order: the class's
// selectors, then the request's), so a device of another driver costs only the class selector.
//
// The variants are timed in turn, round after round, so a change of the machine's load reaches them all alike.
// CPU time is the process's user+system time (getrusage), which includes the garbage collector's work for the
// allocations DeviceMatches makes.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"
)

// Bounds on the input, which comes from our own bench but is read like any other input.
const (
	maxRounds     = 100
	maxIterations = 10_000_000
)

type device struct {
	Name       string                                                    `json:"name"`
	Driver     string                                                    `json:"driver"`
	Attributes map[resourceapi.QualifiedName]resourceapi.DeviceAttribute `json:"attributes"`
	Capacity   map[resourceapi.QualifiedName]resourceapi.DeviceCapacity  `json:"capacity"`
}

type input struct {
	Expressions []string `json:"expressions"`
	Devices     []device `json:"devices"`
	Rounds      int      `json:"rounds"`
	Iterations  int      `json:"iterations"`
}

type result struct {
	Name            string  `json:"name"`
	Round           int     `json:"round"`
	EvalsPerIter    float64 `json:"evalsPerIteration"`
	CPUNanosPerEval float64 `json:"cpuNanosPerEval"`
	BytesPerEval    float64 `json:"bytesPerEval"`
	AllocsPerEval   float64 `json:"allocsPerEval"`
}

func cpuNanos() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// matches evaluates the expressions in order until one is false, as the allocator's selectorsMatch does with a
// class's selectors and then a request's; it returns how many it evaluated.
func matches(ctx context.Context, programs []cel.CompilationResult, input cel.Device) (int, error) {
	for i, p := range programs {
		ok, _, err := p.DeviceMatches(ctx, input)
		if err != nil {
			return i + 1, fmt.Errorf("expression %q: %w", p.Expression, err)
		}
		if !ok {
			return i + 1, nil
		}
	}
	return len(programs), nil
}

func run() error {
	dec := json.NewDecoder(os.Stdin)
	dec.DisallowUnknownFields()
	var in input
	if err := dec.Decode(&in); err != nil {
		return fmt.Errorf("input: %w", err)
	}
	if in.Rounds < 1 || in.Rounds > maxRounds {
		return fmt.Errorf("rounds %d: allowed 1..%d", in.Rounds, maxRounds)
	}
	if in.Iterations < 1 || in.Iterations > maxIterations {
		return fmt.Errorf("iterations %d: allowed 1..%d", in.Iterations, maxIterations)
	}
	if len(in.Expressions) == 0 || len(in.Devices) == 0 {
		return fmt.Errorf("expressions and devices: at least one of each")
	}
	// The compilation cache and CEL features as kube-scheduler 1.36 creates them with its default feature gates
	// (pkg/scheduler/framework/plugins/dynamicresources: DRAConsumableCapacity beta and on, DRAListTypeAttributes
	// alpha and off).
	cache := cel.NewCache(len(in.Expressions), cel.Features{EnableConsumableCapacity: true})
	programs := make([]cel.CompilationResult, len(in.Expressions))
	for i, e := range in.Expressions {
		programs[i] = cache.GetOrCompile(e)
		if programs[i].Error != nil {
			return fmt.Errorf("expression %q: %v", e, programs[i].Error)
		}
	}
	ctx := context.Background()
	var results []result
	for round := 0; round < in.Rounds; round++ {
		for _, d := range in.Devices {
			input := cel.Device{Driver: d.Driver, Attributes: d.Attributes, Capacity: d.Capacity}
			if _, err := matches(ctx, programs, input); err != nil { // warm, and any error before timing
				return fmt.Errorf("device %s: %w", d.Name, err)
			}
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			start := cpuNanos()
			count := 0
			for i := 0; i < in.Iterations; i++ {
				n, err := matches(ctx, programs, input)
				if err != nil {
					return err
				}
				count += n
			}
			cpu := cpuNanos() - start
			runtime.ReadMemStats(&after)
			evals := float64(count)
			results = append(results, result{
				Name: d.Name, Round: round, EvalsPerIter: evals / float64(in.Iterations),
				CPUNanosPerEval: float64(cpu) / evals,
				BytesPerEval:    float64(after.TotalAlloc-before.TotalAlloc) / evals,
				AllocsPerEval:   float64(after.Mallocs-before.Mallocs) / evals,
			})
		}
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{"results": results})
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
}
