//go:build chaos

package chaos

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tsingress/tsingress/internal/testing/credsearch"
	"github.com/tsingress/tsingress/test/framework"
)

// logCollector follows the logs of every container in the operator's namespace into files, from
// the moment it starts until its container ends (Pods the suite deletes take their logs with
// them), resuming where it stopped when the API server went away. Every few seconds it also
// collects the credentials the proxies and the operator hold in their Secrets, for the search at
// the end: most of those Secrets are gone by then.
type logCollector struct {
	dir    string
	start  time.Time
	cancel context.CancelFunc
	done   sync.WaitGroup

	mu          sync.Mutex
	following   map[string]bool // "uid/container/restarts"
	finished    map[string]bool
	lastRead    map[string]time.Time
	files       map[string]string // key → file
	credentials map[string]string // secret → what it is
}

func startLogCollector(dir string) *logCollector {
	ctx, cancel := context.WithCancel(context.Background())
	l := &logCollector{dir: dir, start: time.Now(), cancel: cancel, following: map[string]bool{}, finished: map[string]bool{},
		lastRead: map[string]time.Time{}, files: map[string]string{}, credentials: map[string]string{}}
	l.done.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			l.scan(ctx)
			if i%5 == 0 {
				l.harvest(ctx)
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	})
	return l
}

// stop ends the collection once every container has been followed to now.
func (l *logCollector) stop() {
	time.Sleep(2 * time.Second)
	l.cancel()
	l.done.Wait()
}

func (l *logCollector) scan(ctx context.Context) {
	pods := &corev1.PodList{}
	if err := suite.ListEach(ctx, pods, proxyNS()); err != nil {
		return // the API server is away; resumed later
	}
	for _, p := range pods.Items {
		for _, cs := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
			if cs.State.Running == nil && cs.State.Terminated == nil {
				continue
			}
			key := fmt.Sprintf("%s/%s/%d", p.UID, cs.Name, cs.RestartCount)
			l.mu.Lock()
			busy := l.following[key] || l.finished[key]
			if !busy {
				l.following[key] = true
				if l.files[key] == "" {
					l.files[key] = filepath.Join(l.dir, fmt.Sprintf("%s_%s_%d_%s.log", p.Name, cs.Name, cs.RestartCount, string(p.UID)[:8]))
				}
			}
			l.mu.Unlock()
			if !busy {
				l.done.Go(func() { l.follow(ctx, p.Namespace, p.Name, cs.Name, key, cs.State.Terminated != nil) })
			}
		}
	}
}

// follow streams one container's log to its file; a stream cut short is taken up again by a
// later scan from where it stopped.
func (l *logCollector) follow(ctx context.Context, ns, pod, container, key string, terminated bool) {
	l.mu.Lock()
	since, file := l.lastRead[key], l.files[key]
	l.mu.Unlock()
	// The run's lines only: in CI the cluster ran the e2e suite first, and its operator's Pod
	// may still be ending when the suite starts.
	opts := &corev1.PodLogOptions{Container: container, Follow: !terminated, SinceTime: &metav1.Time{Time: l.start}}
	if !since.IsZero() {
		opts.SinceTime = &metav1.Time{Time: since.Add(-time.Second)}
	}
	complete := false
	defer func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.following[key] = false
		l.finished[key] = complete || terminated
	}()
	// The client's timeout would cut a followed stream: a client of its own.
	stream, err := suite.logClient.CoreV1().Pods(ns).GetLogs(pod, opts).Stream(ctx)
	if err != nil {
		return
	}
	defer stream.Close()
	f, err := os.OpenFile(file, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	r := bufio.NewReader(stream)
	for {
		line, err := r.ReadBytes('\n')
		if len(line) > 0 {
			_, _ = f.Write(line)
			l.mu.Lock()
			l.lastRead[key] = time.Now()
			l.mu.Unlock()
		}
		if err == io.EOF {
			// The container ended, or the stream was cut; a container still running is taken
			// up again by the next scan.
			p := &corev1.Pod{}
			if gerr := suite.K8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: pod}, p); gerr != nil {
				complete = strings.Contains(gerr.Error(), "not found")
			} else {
				complete = !containerRunning(p, container)
			}
			return
		}
		if err != nil {
			return
		}
	}
}

func containerRunning(p *corev1.Pod, name string) bool {
	for _, cs := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
		if cs.Name == name {
			return cs.State.Running != nil
		}
	}
	return false
}

var (
	forwarding = regexp.MustCompile(`^Forwarding from 127\.0\.0\.1:(\d+) `)
	pemKey     = regexp.MustCompile(`-----BEGIN [A-Z ]*PRIVATE KEY-----\n([A-Za-z0-9+/=\n]+)-----END`)
	privKey    = regexp.MustCompile(`privkey:[0-9a-f]{64}`)
)

// harvest collects the private keys held in the Secrets of the operator's namespace: TLS and
// ACME account keys (PEM) and the nodes' machine and node keys (privkey:).
func (l *logCollector) harvest(ctx context.Context) {
	secrets := &corev1.SecretList{}
	if err := suite.K8s.List(ctx, secrets, client.InNamespace(opNS)); err != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range secrets.Items {
		for k, v := range s.Data {
			for _, m := range pemKey.FindAllSubmatch(v, -1) {
				lines := strings.Split(strings.TrimSpace(string(m[1])), "\n")
				l.credentials[lines[len(lines)/2]] = fmt.Sprintf("a private key (PEM) of Secret %s, key %s", s.Name, k)
			}
			for _, m := range privKey.FindAll(v, -1) {
				l.credentials[string(m)] = fmt.Sprintf("a node private key of Secret %s", s.Name)
			}
		}
	}
}

// operatorLogs lists the files of the operator's container logs, by name.
func (l *logCollector) operatorLogs() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var files []string
	for _, f := range l.files {
		if strings.HasPrefix(filepath.Base(f), "operator-") {
			files = append(files, f)
		}
	}
	slices.Sort(files)
	return files
}

// dumpTails writes the end of the operator's logs, for a failed spec.
func (l *logCollector) dumpTails(lines int) {
	files := l.operatorLogs()
	for _, f := range files[max(0, len(files)-2):] {
		b, _ := os.ReadFile(f)
		all := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
		GinkgoWriter.Printf("\n----- %s (last %d lines) -----\n%s\n", filepath.Base(f), lines, bytes.Join(all[max(0, len(all)-lines):], []byte("\n")))
	}
}

// searchCredentials looks for every credential of the run in every log the cluster kept of it:
// the operator's and the proxies' containers (collected as they ran), the kubelet's and
// containerd's journal on the node, every Event, every Pod's spec and the status and annotations
// of every object the operator reads or writes. The credentials are the tailnet's OAuth client
// secret, every auth key and client secret (all "tskey-"), and the private keys the proxies' and
// the operator's Secrets held at any time: TLS and ACME account keys, node keys; each as written
// and base64-encoded at every alignment. A credential planted first must be found.
func searchCredentials(ctx context.Context) {
	GinkgoHelper()
	l := suite.logs
	l.harvest(ctx)
	l.stop()
	needles := credsearch.New()
	needles.Add("tskey-", "an auth key or OAuth client secret (tskey-)")
	needles.Add(suite.oauthSecret, "the tailnet's OAuth client secret")
	kinds := map[string]int{}
	for k, v := range l.credentials {
		needles.Add(k, v)
		kinds[strings.SplitN(v, " of Secret", 2)[0]]++
	}
	haystacks := map[string][]byte{}
	for _, f := range l.files {
		if b, err := os.ReadFile(f); err == nil {
			haystacks[filepath.Base(f)] = b
		}
	}
	containers := len(haystacks)
	journal, err := nodeExec(ctx, "journalctl", "--no-pager", "-o", "cat", "-u", "kubelet", "-u", "containerd")
	Expect(err).NotTo(HaveOccurred(), "the node's journal")
	haystacks["the kubelet's and containerd's journal"] = []byte(journal)
	r, err := credsearch.SearchCluster(ctx, suite.K8s, opNS, needles, haystacks)
	Expect(err).NotTo(HaveOccurred())
	eventCount, size, plantedHits, hits := r.Events, r.Bytes, r.PlantedHits, r.Hits
	suite.report.add("### No credential in any log, Event or object\n\n"+
		"After every other spec: %d container logs (the operator's and every proxy's, followed from start to end), the "+
		"kubelet's and containerd's journal (%.1f MiB), %d Events, every Pod's spec and the status and annotations of every "+
		"object the operator reads or writes (%.1f MiB in all) searched for %d credentials, each as written and base64 at every "+
		"alignment (%d forms): the OAuth client secret, every auth key and client secret by their tskey- prefix, %d private keys "+
		"(PEM: TLS and ACME account keys) and %d node private keys collected from the proxies' Secrets during the run. A "+
		"credential planted first, in an annotation and base64 in an Event, was found %d times. Hits: %d.\n",
		containers, float64(len(journal))/(1<<20), eventCount, float64(size)/(1<<20),
		len(l.credentials)+3, needles.Len(), kinds["a private key (PEM)"], kinds["a node private key"], len(plantedHits), len(hits))
	Expect(plantedHits).To(ContainElements(ContainSubstring("in "+credsearch.InEvents), ContainSubstring("in "+credsearch.InAnnotations)),
		"the planted credential: the search must find what it looks for")
	Expect(containers).To(BeNumerically(">", 3), "container logs collected")
	Expect(kinds["a node private key"]).To(BeNumerically(">", 0), "node keys collected: the search must know what to look for")
	Expect(hits).To(BeEmpty(), "credentials found")
}

// mintedKey finds the key an operator log line says it minted, the proxy replica it is for, and
// the UID of its config Secret, which tells it from an earlier replica of its name.
var mintedKey = regexp.MustCompile(`"msg":"minted auth key".*?"keyID":"([^"]+)","proxy":"([^"]+)","configSecretUID":"([^"]*)"`)

// revokedKey finds a key the operator revoked and why.
var revokedKey = regexp.MustCompile(`"msg":"revoked auth key".*?"keyID":"([^"]+)","reason":"([^"]+)"`)

// undelivered are the reasons the operator gives for revoking a key that no config held: the
// write meant to deliver it failed, or an operator stopped between the mint and the write.
var undelivered = []string{"its config write failed", "minted but not delivered"}

// reportKeysMinted counts the auth keys the operator minted for each proxy replica over the
// run, from every log of its containers (collected until the collector stopped), and of those
// the keys given: delivered in a config rather than revoked at once for want of a write.
// Goal: one key given per replica. A replica is its name and its config Secret: an object
// deleted and created again under its name gets a new proxy, and a new key. Keys count by ID:
// a log stream taken up again after a cut repeats its last second.
func reportKeysMinted() {
	GinkgoHelper()
	files := suite.logs.operatorLogs()
	minted := map[string]map[string]bool{} // replica → key IDs
	revoked := map[string]string{}         // key ID → reason
	for _, f := range files {
		b, err := os.ReadFile(f)
		Expect(err).NotTo(HaveOccurred())
		for _, m := range mintedKey.FindAllSubmatch(b, -1) {
			replica := string(m[2]) + " (config Secret " + string(m[3]) + ")"
			if minted[replica] == nil {
				minted[replica] = map[string]bool{}
			}
			minted[replica][string(m[1])] = true
		}
		for _, m := range revokedKey.FindAllSubmatch(b, -1) {
			revoked[string(m[1])] = string(m[2])
		}
	}
	perReplica, given := map[string]int{}, map[string]int{}
	var twice []string
	for replica, ids := range minted {
		perReplica[replica], given[replica] = len(ids), 0
		var fates []string
		for _, id := range slices.Sorted(maps.Keys(ids)) {
			reason := revoked[id]
			if !slices.Contains(undelivered, reason) {
				given[replica]++
			}
			fates = append(fates, fmt.Sprintf("%s (revoked: %q)", id, reason))
		}
		if given[replica] > 1 {
			twice = append(twice, replica+": "+strings.Join(fates, ", "))
		}
	}
	slices.Sort(twice)
	suite.report.add("### Auth keys minted per proxy\n\nFrom the operator's logs over the whole run (%d log files, every "+
		"restart of its container): %d auth keys minted for %d proxy replicas (replicas by keys minted: %s), of which %d "+
		"revoked at once as no config held them (the write meant to deliver them failed, or the operator stopped before it); "+
		"replicas by keys given: %s. Goal: one key given per replica, whatever the faults.\n",
		len(files), sumValues(perReplica), len(perReplica), distribution(perReplica), sumValues(perReplica)-sumValues(given), distribution(given))
	Expect(len(perReplica)).To(BeNumerically(">", 3), "proxies found in the operator's logs: the count must see them")
	Expect(twice).To(BeEmpty(), "replicas given more than one auth key, with each key's revocation reason (\"\" for none)")
}

// distribution says how many replicas have each count: "5 with 1, 1 with 2".
func distribution(perReplica map[string]int) string {
	counts := map[int]int{} // count → replicas
	for _, n := range perReplica {
		counts[n]++
	}
	var dist []string
	for _, n := range slices.Sorted(maps.Keys(counts)) {
		dist = append(dist, fmt.Sprintf("%d with %d", counts[n], n))
	}
	return strings.Join(dist, ", ")
}

func sumValues(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// metricsReader is a ServiceAccount allowed to scrape the operator's metrics, and its token.
var metricsToken = sync.OnceValue(func() string {
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: opNS, Name: "chaos-metrics"}}
	Expect(client.IgnoreAlreadyExists(suite.K8s.Create(ctx, sa))).To(Succeed())
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "chaos-metrics"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "tsingress-metrics-reader"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: opNS, Name: sa.Name}}}
	Expect(client.IgnoreAlreadyExists(suite.K8s.Create(ctx, crb))).To(Succeed())
	tr, err := suite.Clientset.CoreV1().ServiceAccounts(opNS).CreateToken(ctx, sa.Name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3 * 3600)}}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	return tr.Status.Token
})

// reconciles scrapes the operator's metrics (through a port-forward to its Pod) and returns the
// reconciles its controllers have made and the panics they recovered from, since it started.
func reconciles(ctx context.Context) (total, panics float64, err error) {
	pod := operatorPod(ctx)
	// kubectl's port-forward: client-go's needs a module this project does not carry.
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := exec.CommandContext(pctx, framework.EnvOr("KUBECTL", "../../bin/kubectl"), "-n", opNS, "port-forward", "pod/"+pod.Name, ":8443")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	// The port-forward runs until killed: cancel first, then reap it.
	defer func() {
		cancel()
		_ = cmd.Wait()
	}()
	port := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if m := forwarding.FindStringSubmatch(sc.Text()); m != nil {
				port <- m[1]
				break
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	var local string
	select {
	case local = <-port:
	case <-time.After(30 * time.Second):
		return 0, 0, fmt.Errorf("port-forward to %s: not ready", pod.Name)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://127.0.0.1:"+local+"/metrics", nil)
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Authorization", "Bearer "+metricsToken())
	// The metrics endpoint serves a self-signed certificate; the token is what is checked.
	hc := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("metrics: %s", resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		name, _, _ := strings.Cut(line, "{")
		if name != "controller_runtime_reconcile_total" && name != "controller_runtime_reconcile_panics_total" {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			continue
		}
		if name == "controller_runtime_reconcile_total" {
			total += v
		} else {
			panics += v
		}
	}
	return total, panics, sc.Err()
}
