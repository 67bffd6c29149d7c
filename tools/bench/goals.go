package main

import (
	"fmt"
	"strings"
	"time"
)

// goal is one target of issue 18, judged from a run's figures.
type goal struct {
	name   string
	met    string // "yes", "no" or "not measured"
	figure string
}

func verdict(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}

// goals judges the run against the targets; what the run did not measure says so.
func (r *report) goals() []goal {
	var out []goal
	byName := map[string]dataPathResult{}
	for _, res := range r.dataPath {
		byName[res.sc.name] = res
	}
	for _, sc := range []string{"small GET, keep-alive, 1 client", "small GET, keep-alive, 16 clients"} {
		g := goal{name: "L7 " + sc + ": ≥ 1.2× the Serve path, p99 no worse", met: "not measured"}
		if res, ok := byName[sc]; ok {
			o, ref := res.medians["ours"], res.medians["original (Serve)"]
			g.met = verdict(res.ratio() >= 1.2 && o.p99 <= ref.p99)
			g.figure = fmt.Sprintf("%.2f×; p99 %s vs %s", res.ratio(), ms(o.p99), ms(ref.p99))
		}
		out = append(out, g)
	}
	g := goal{name: "L7 1 MiB GET: ≥ 1.0× the Serve path", met: "not measured"}
	if res, ok := byName["1 MiB GET, 1 client"]; ok {
		g.met, g.figure = verdict(res.ratio() >= 1.0), fmt.Sprintf("%.2f×", res.ratio())
	}
	out = append(out, g)

	g = goal{name: "new proxy → first HTTPS 200 ≤ 2 s, no request that hangs", met: "not measured"}
	if len(r.first200) > 0 {
		var first []time.Duration
		hung := 0
		for _, f := range r.first200 {
			first = append(first, f.first200)
			for _, a := range f.attempts {
				if strings.Contains(a, "timeout") {
					hung++
				}
			}
		}
		m := medianDur(first)
		g.met = verdict(m <= 2*time.Second && hung == 0)
		g.figure = fmt.Sprintf("median %s of %d; %d tries timed out", ms(m), len(first), hung)
	}
	out = append(out, g)

	this := r.scale["this build"]
	for _, t := range []struct {
		n     int
		limit time.Duration
	}{{1000, 10 * time.Second}, {5000, 60 * time.Second}} {
		g := goal{name: fmt.Sprintf("%d Ingresses and %d Services converge ≤ %s after the last apply", t.n, t.n, secs(t.limit)), met: "not measured"}
		for _, s := range this {
			if s.n != t.n {
				continue
			}
			if s.status == 0 {
				g.met, g.figure = "no", "did not converge: "+s.failure
				break
			}
			g.met, g.figure = verdict(s.status <= t.limit), "every status "+secs(s.status)+" after the last apply"
		}
		out = append(out, g)
	}
	g = goal{name: "status within 10 s of the replicas' report", met: "not measured"}
	if len(this) > 0 {
		worst, figs := time.Duration(0), []string{}
		for _, s := range this {
			if s.status == 0 {
				continue
			}
			worst = max(worst, s.afterReport)
			figs = append(figs, fmt.Sprintf("N=%d: %s", s.n, secs(s.afterReport)))
		}
		if len(figs) > 0 {
			g.met, g.figure = verdict(worst <= 10*time.Second), strings.Join(figs, ", ")
		}
	}
	out = append(out, g)
	g = goal{name: "operator CPU per object flat in N", met: "not measured"}
	var converged []scaleResult
	for _, s := range this {
		if s.status != 0 {
			converged = append(converged, s)
		}
	}
	if len(converged) > 1 {
		first, last := converged[0], converged[len(converged)-1]
		growth := float64(last.cpuPerObject()) / float64(first.cpuPerObject())
		// Flat: the per-object cost of the largest N within twice that of the smallest.
		g.met = verdict(growth <= 2)
		var figs []string
		for _, s := range converged {
			figs = append(figs, fmt.Sprintf("N=%d: %.1f ms", s.n, float64(s.cpuPerObject().Microseconds())/1000))
		}
		g.figure = strings.Join(figs, ", ")
	}
	out = append(out, g)
	g = goal{name: "no object over 256 KiB", met: "not measured"}
	if len(converged) > 0 {
		s := converged[len(converged)-1]
		g.met = verdict(s.largestObject <= 256<<10)
		g.figure = fmt.Sprintf("at N=%d: %s, %d KiB", s.n, s.largestName, s.largestObject>>10)
	}
	out = append(out, g)
	g = goal{name: "operator RSS ≤ 80 MiB with the unrelated objects", met: "not measured"}
	for _, m := range r.memory {
		if m.name == "this build" {
			g.met, g.figure = verdict(m.withTLS <= 80<<20), mib(m.withTLS)
		}
	}
	return append(out, g)
}
