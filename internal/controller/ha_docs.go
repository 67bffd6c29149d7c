package controller

import (
	"context"
	"encoding/json"
	"maps"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/tsingress/tsingress/internal/contract"
)

// groupContent is what a group ConfigMap says, decoded: the Serve config, the DNAT mappings and
// the owner index.
type groupContent struct {
	serve  *contract.ServeConfig
	dnat   *contract.DNATConfig
	owners map[string]string
}

// decodeGroup reads a group ConfigMap's documents. A document this build cannot read counts as
// empty: the writer then replaces it with one it can.
func decodeGroup(cm *corev1.ConfigMap) *groupContent {
	data := cmData(cm)
	g := &groupContent{owners: owners(cm)}
	if doc, _, err := contract.ServeConfigs.Decode(data); err == nil {
		g.serve = doc
	} else {
		g.serve = &contract.ServeConfig{}
	}
	if doc, _, err := contract.DNATConfigs.Decode(data); err == nil {
		g.dnat = doc
	} else {
		g.dnat = &contract.DNATConfig{}
	}
	if g.serve.Services == nil {
		g.serve.Services = map[string]contract.WebService{}
	}
	if g.dnat.Services == nil {
		g.dnat.Services = map[string]contract.DNATService{}
	}
	return g
}

// clone copies the content for a change: entries are replaced whole, never changed in place, so
// the maps are copied and the entries shared.
func (g *groupContent) clone() *groupContent {
	serve, dnat := *g.serve, *g.dnat
	serve.Services, dnat.Services = maps.Clone(g.serve.Services), maps.Clone(g.dnat.Services)
	return &groupContent{serve: &serve, dnat: &dnat, owners: maps.Clone(g.owners)}
}

// has reports whether the group serves svcName, in either document.
func (g *groupContent) has(svcName string) bool {
	return hasService(g.serve.Services, svcName) || hasService(g.dnat.Services, svcName)
}

// setServe sets (ws nil: removes) a service's Serve entry; the owner index follows.
func (g *groupContent) setServe(svcName string, ws *contract.WebService, owner string) {
	if ws == nil {
		delete(g.serve.Services, svcName)
	} else {
		g.serve.Services[svcName] = *ws
	}
	g.setOwner(svcName, ws != nil, owner)
}

// setDNAT sets (m nil: removes) a service's DNAT entry; the owner index follows.
func (g *groupContent) setDNAT(svcName string, m *contract.DNATService, owner string) {
	if m == nil {
		delete(g.dnat.Services, svcName)
	} else {
		g.dnat.Services[svcName] = *m
	}
	g.setOwner(svcName, m != nil, owner)
}

// setOwner records owner for an entry just set; an entry just removed keeps its owner while its
// other document still has it.
func (g *groupContent) setOwner(svcName string, set bool, owner string) {
	switch {
	case set:
		g.owners[svcName] = owner
	case !g.has(svcName):
		delete(g.owners, svcName)
	}
}

// encode renders the documents and the owner index as ConfigMap data. keys are every key the
// documents may be stored under: those not in data are to be removed.
func (g *groupContent) encode() (data map[string]string, keys []string, err error) {
	serve, err := contract.ServeConfigs.Encode(g.serve)
	if err != nil {
		return nil, nil, err
	}
	dnat, err := contract.DNATConfigs.Encode(g.dnat)
	if err != nil {
		return nil, nil, err
	}
	data = map[string]string{}
	for k, v := range serve {
		data[k] = string(v)
	}
	for k, v := range dnat {
		data[k] = string(v)
	}
	o, err := json.Marshal(g.owners)
	if err != nil {
		return nil, nil, err
	}
	data[ownersKey] = string(o)
	keys = append(contract.ServeConfigs.Keys(), contract.DNATConfigs.Keys()...)
	return data, append(keys, ownersKey), nil
}

// groupWriter writes ProxyGroup documents through a batcher: the changes of concurrent
// reconcilers to one group are applied in one read-modify-write. With many objects on a group,
// the documents are decoded, encoded and sent once per batch instead of once per object.
//
// It also keeps the decoded content of each group ConfigMap by resourceVersion, so that readers
// (which group serves a name, what an object owns) do not decode the documents per reconcile.
type groupWriter struct {
	client    client.Client
	api       client.Reader // after a conflict: the cache may not have our last write yet
	namespace string
	batch     batcher[func(*groupContent)]
	last      lastWritten[*corev1.ConfigMap] // by group

	mu      sync.Mutex
	decoded map[string]decodedContent // by ConfigMap name
}

type decodedContent struct {
	resourceVersion string
	content         *groupContent
}

func newGroupWriter(c client.Client, api client.Reader, namespace string) *groupWriter {
	w := &groupWriter{client: c, api: api, namespace: namespace, decoded: map[string]decodedContent{}}
	w.batch.flush = w.flush
	return w
}

// flushTimeout bounds one flush: reading, writing and retrying conflicts.
const flushTimeout = 30 * time.Second

// change applies f to group pg's documents, batched with the changes of other reconcilers, and
// returns once it is stored (or failed: errConfigFull, a missing ConfigMap, an API error).
func (w *groupWriter) change(ctx context.Context, pg string, f func(*groupContent)) error {
	return w.batch.do(ctx, pg, f)
}

// maxFlushAttempts bounds the conflicts one flush retries; the reconcilers retry after that.
const maxFlushAttempts = 5

// flush applies a batch to group pg's ConfigMap and returns each change's error.
func (w *groupWriter) flush(pg string, batch []func(*groupContent)) []error {
	ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
	defer cancel()
	errs := make([]error, len(batch))
	fail := func(err error) []error {
		for i := range errs {
			if errs[i] == nil {
				errs[i] = err
			}
		}
		return errs
	}
	key := client.ObjectKey{Namespace: w.namespace, Name: group{pg}.configMap()}
	start := time.Now()
	var reader client.Reader = w.client
	for attempt := 1; ; attempt++ {
		cm := &corev1.ConfigMap{}
		if err := reader.Get(ctx, key, cm); err != nil {
			return fail(err)
		}
		if last, ok := w.last.get(pg); ok && reader == w.client {
			cm = freshest(cm, last)
		}
		written, err := w.write(ctx, cm, batch, errs)
		if apierrors.IsConflict(err) && attempt < maxFlushAttempts {
			reader = w.api
			clear(errs)
			continue
		}
		if err != nil {
			w.last.forget(pg)
			return fail(err)
		}
		if written != nil {
			w.last.set(pg, written)
			failed := 0
			for _, err := range errs {
				if err != nil {
					failed++
				}
			}
			log.FromContext(ctx).Info("wrote group documents", "proxyGroup", pg, "configMap", written.Name,
				"changes", len(batch), "failed", failed, "attempts", attempt, "took", time.Since(start).Round(time.Millisecond).String(),
				"bytes", dataSize(written.Data, nil, nil))
		}
		return errs
	}
}

// freshest is the object to start a read-modify-write from: the cached one, or a copy of the
// one last written when the cache does not show that write yet.
func freshest[T client.Object](cached, last T) T {
	if last.GetUID() == cached.GetUID() && newerVersion(last.GetResourceVersion(), cached.GetResourceVersion()) {
		return last.DeepCopyObject().(T)
	}
	return cached
}

// write applies the changes to cm and stores it. Changes that would take the documents past the
// size limit fail with errConfigFull, and the rest are stored: the first try applies them all;
// only when that is too large are they applied one at a time, keeping those that fit.
func (w *groupWriter) write(ctx context.Context, cm *corev1.ConfigMap, batch []func(*groupContent), errs []error) (*corev1.ConfigMap, error) {
	before := cm.DeepCopy()
	content := w.content(cm).clone()
	for _, c := range batch {
		c(content)
	}
	data, keys, err := content.encode()
	if err != nil {
		return nil, err
	}
	if dataSize(cm.Data, data, keys) > maxGroupDocumentBytes {
		if content, data, err = fitting(cm, batch, errs); err != nil {
			return nil, err
		}
	}
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	for _, k := range keys {
		if v, ok := data[k]; ok {
			cm.Data[k] = v
		} else {
			delete(cm.Data, k)
		}
	}
	if maps.Equal(before.Data, cm.Data) {
		w.remember(cm, content)
		return nil, nil
	}
	if err := patchShared(ctx, w.client, before, cm); err != nil {
		return nil, err
	}
	w.remember(cm, content)
	return cm, nil
}

// fitting applies the changes one by one, failing with errConfigFull each one after which the
// documents would be too large. It is the slow path of a nearly full group.
func fitting(cm *corev1.ConfigMap, batch []func(*groupContent), errs []error) (*groupContent, map[string]string, error) {
	content := decodeGroup(cm)
	data, keys, err := content.encode()
	if err != nil {
		return nil, nil, err
	}
	for i, c := range batch {
		c(content)
		next, _, err := content.encode()
		if err != nil {
			return nil, nil, err
		}
		if dataSize(cm.Data, next, keys) > maxGroupDocumentBytes {
			errs[i] = errConfigFull
			content = decodeGroupData(cm, data) // back to the last that fit
			continue
		}
		data = next
	}
	return content, data, nil
}

// decodeGroupData decodes cm as it would be with data in place of its documents.
func decodeGroupData(cm *corev1.ConfigMap, data map[string]string) *groupContent {
	cp := cm.DeepCopy()
	cp.Data = data
	return decodeGroup(cp)
}

// dataSize is the size of cm's data once the documents' keys hold data.
func dataSize(current, data map[string]string, keys []string) int {
	size := 0
	for _, v := range current {
		size += len(v)
	}
	for _, k := range keys {
		size += len(data[k]) - len(current[k])
	}
	return size
}

// newerVersion reports whether resourceVersion a is newer than b. Resource versions are opaque
// to clients but, from etcd, increasing integers; anything else is taken as not newer.
func newerVersion(a, b string) bool {
	if len(a) != len(b) {
		return len(a) > len(b) && isDigits(a) && isDigits(b)
	}
	return a > b && isDigits(a) && isDigits(b)
}

func isDigits(s string) bool {
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return s != ""
}

// remember keeps the decoded content of a ConfigMap at its resourceVersion.
func (w *groupWriter) remember(cm *corev1.ConfigMap, content *groupContent) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.decoded[cm.Name] = decodedContent{resourceVersion: cm.ResourceVersion, content: content}
}

// content returns the decoded documents of cm, decoding them only when cm is at another
// resourceVersion than last time. The result is shared: callers must not change it.
func (w *groupWriter) content(cm *corev1.ConfigMap) *groupContent {
	w.mu.Lock()
	d, ok := w.decoded[cm.Name]
	w.mu.Unlock()
	if ok && d.resourceVersion == cm.ResourceVersion {
		return d.content
	}
	c := decodeGroup(cm)
	w.remember(cm, c)
	return c
}
