package web_test

import (
	"io"
	"net/http"
	"syscall"
	"testing"
	"time"
)

// cpuTime is the process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkProxyRequests measures the request rate through the proxy (port 80, kept-alive
// client connections, parallel clients) to a Service of 10 echo Pods: through the Service's
// address alone, as before endpoint balancing (the URL is one Pod, standing in for kube-proxy's
// in-kernel DNAT, which pins a kept-alive connection to one Pod), and balanced across the
// endpoints. It reports requests per second, the CPU time per request, and how many Pods
// served.
func BenchmarkProxyRequests(b *testing.B) {
	ps := pods(b, "echo", 10)
	for _, bc := range []struct {
		name      string
		endpoints []string
	}{
		{"clusterIP", nil},
		{"endpoints", addrs(ps)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for _, p := range ps {
				p.Served.Store(0)
			}
			lb := startLoopback(b, balanced("http://"+ps[0].Addr, bc.endpoints), nil)
			url := "http://" + lb.http + "/bench"
			cpu := cpuTime(b)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
				for pb.Next() {
					resp, err := c.Get(url)
					if err != nil {
						b.Error(err)
						return
					}
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err != nil {
						b.Error(err)
						return
					}
					if resp.StatusCode != 200 {
						b.Errorf("status %d", resp.StatusCode)
						return
					}
				}
			})
			// The rate depends on what else the machine runs; the CPU time per request (client,
			// proxy and Pods, all in this process) much less.
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
			b.ReportMetric(float64((cpuTime(b)-cpu).Microseconds())/float64(b.N), "cpu-µs/req")
			served := 0
			for _, p := range ps {
				if p.Served.Load() > 0 {
					served++
				}
			}
			b.ReportMetric(float64(served), "pods")
		})
	}
}

// BenchmarkProxyOneClient measures one kept-alive client's requests, one at a time, through the
// proxy (port 80) to one echo Pod: the latency of the proxy's own work, which the data path's
// 1-client figures wait on. It reports requests per second and the CPU time per request.
func BenchmarkProxyOneClient(b *testing.B) {
	ps := pods(b, "echo", 1)
	lb := startLoopback(b, balanced("http://"+ps[0].Addr, nil), nil)
	url := "http://" + lb.http + "/bench"
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	cpu := cpuTime(b)
	b.ResetTimer()
	for b.Loop() {
		resp, err := c.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil {
			b.Fatal(err)
		}
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
	b.ReportMetric(float64((cpuTime(b)-cpu).Microseconds())/float64(b.N), "cpu-µs/req")
}
