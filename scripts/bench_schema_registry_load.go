// A bounded HTTP load loop for scripts/bench-schema-registry.sh: the same client against
// spate's built-in schema registry and against Karapace.
//
//	go run scripts/bench_schema_registry_load.go -url http://127.0.0.1:8081 -mode lookup -ids 1-500
//	go run scripts/bench_schema_registry_load.go -url ... -mode register -prefix run1
//
// lookup: GET /schemas/ids/{id} over the given ids, round robin (no client-side cache: every
// request goes to the registry). register: POST /subjects/{prefix}-{i}/versions with a distinct
// Avro record schema each time (a new id each, one subject each, so no compatibility check).
// Stops after -n requests or -t seconds, whichever comes first; -c connections (keep-alive).
// Prints one JSON line: requests, errors, seconds, per_sec, p50_ms, p99_ms, server_cpu_s (when
// -pid names the server processes: their user+system CPU over the run, from /proc).
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// cpuSeconds adds the CPU seconds of the processes named in pids ("123,456").
func cpuSeconds(pids string) float64 {
	var total float64
	for _, p := range strings.Split(pids, ",") {
		if pid, err := strconv.Atoi(strings.TrimSpace(p)); err == nil && pid > 0 {
			total += cpuOf(pid)
		}
	}
	return total
}

func cpuOf(pid int) float64 {
	// Add the CPU of the process's threads and of its children that were waited for.
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndex(s, ")")+2:])
	var ticks float64
	for _, i := range []int{11, 12, 13, 14} { // utime stime cutime cstime
		v, _ := strconv.ParseFloat(f[i], 64)
		ticks += v
	}
	return ticks / 100.0 // USER_HZ
}

func main() {
	url := flag.String("url", "", "registry base URL")
	mode := flag.String("mode", "lookup", "lookup | register")
	ids := flag.String("ids", "1-1", "lookup: id range FIRST-LAST")
	prefix := flag.String("prefix", "bench", "register: subject prefix")
	n := flag.Int("n", 100000, "at most this many requests")
	secs := flag.Float64("t", 10, "at most this many seconds")
	conc := flag.Int("c", 4, "connections")
	pid := flag.String("pid", "", "server pids (comma-separated), for their CPU time")
	flag.Parse()

	// The prefix in the namespace makes each run's schemas distinct from an earlier run's.
	ns := strings.Map(func(r rune) rune {
		if (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') {
			return r
		}
		return '_'
	}, *prefix)
	var first, last int
	fmt.Sscanf(*ids, "%d-%d", &first, &last)
	client := &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: *conc, MaxConnsPerHost: *conc},
	}
	var next, errs int64
	lat := make([][]time.Duration, *conc)
	deadline := time.Now().Add(time.Duration(*secs * float64(time.Second)))
	cpu0 := cpuSeconds(*pid)
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < *conc; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for time.Now().Before(deadline) {
				i := atomic.AddInt64(&next, 1) - 1
				if i >= int64(*n) {
					return
				}
				var req *http.Request
				if *mode == "lookup" {
					id := first + int(i)%(last-first+1)
					req, _ = http.NewRequest("GET", fmt.Sprintf("%s/schemas/ids/%d", *url, id), nil)
				} else {
					schema := fmt.Sprintf(`{"type":"record","name":"R%d","namespace":"bench.p_%s","fields":[{"name":"id","type":"long"},{"name":"f%d","type":"string","default":""}]}`, i, ns, i)
					body, _ := json.Marshal(map[string]string{"schema": schema})
					req, _ = http.NewRequest("POST", fmt.Sprintf("%s/subjects/%s-%d/versions", *url, *prefix, i), bytes.NewReader(body))
					req.Header.Set("Content-Type", "application/vnd.schemaregistry.v1+json")
				}
				t0 := time.Now()
				resp, err := client.Do(req)
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						err = fmt.Errorf("status %d", resp.StatusCode)
					}
				}
				if err != nil {
					atomic.AddInt64(&errs, 1)
					continue
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		}(w)
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	cpu := cpuSeconds(*pid) - cpu0
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	sort.Slice(all, func(a, b int) bool { return all[a] < all[b] })
	pct := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		return float64(all[int(p*float64(len(all)-1))].Microseconds()) / 1000
	}
	out, _ := json.Marshal(map[string]any{
		"mode": *mode, "requests": len(all), "errors": errs, "seconds": elapsed,
		"per_sec": float64(len(all)) / elapsed, "p50_ms": pct(0.5), "p99_ms": pct(0.99),
		"server_cpu_s": cpu, "connections": *conc,
	})
	fmt.Println(string(out))
}
