package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/tsingress/tsingress/internal/contract"
)

// configUpdate is a changed proxy config, or the error reading it.
type configUpdate struct {
	cfg     *contract.ProxyConfig
	version int
	err     error
}

// configSource reads the proxy config and then follows its changes.
type configSource interface {
	load(ctx context.Context) (*contract.ProxyConfig, int, error)
	// watch sends every change from the config last loaded until ctx ends.
	watch(ctx context.Context, last configUpdate, updates chan<- configUpdate)
}

// changes passes on only what differs from the last config or error seen, since a Secret
// also changes when the proxy writes its state into it.
type changes struct {
	last configUpdate
}

func (c *changes) changed(u configUpdate) bool {
	same := c.last.version == u.version && reflect.DeepEqual(c.last.cfg, u.cfg) &&
		(c.last.err == nil) == (u.err == nil) && (u.err == nil || c.last.err.Error() == u.err.Error())
	c.last = u
	return !same
}

// secretSource reads the config from a Secret through the API and watches that one Secret, so
// that the operator's changes apply within a second.
type secretSource struct {
	client    kubernetes.Interface
	namespace string
	name      string
	log       *slog.Logger
}

func (s *secretSource) load(ctx context.Context) (*contract.ProxyConfig, int, error) {
	sec, err := s.client.CoreV1().Secrets(s.namespace).Get(ctx, s.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, 0, fmt.Errorf("config Secret %s/%s does not exist", s.namespace, s.name)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("reading config Secret %s/%s: %w", s.namespace, s.name, err)
	}
	cfg, v, err := contract.ProxyConfigs.Decode(sec.Data)
	if errors.Is(err, contract.ErrNoDocument) {
		// The operator records its key's intent on the Secret before it writes the config.
		return nil, 0, fmt.Errorf("config Secret %s/%s holds no config yet", s.namespace, s.name)
	}
	if err != nil {
		return nil, 0, &invalidConfig{fmt.Errorf("config Secret %s/%s: %w", s.namespace, s.name, err)}
	}
	return cfg, v, nil
}

// invalidConfig is a config that was read and cannot be used: of versions this build does not
// read, or invalid. Waiting does not mend it; another operator or proxy version does.
type invalidConfig struct{ err error }

func (e *invalidConfig) Error() string { return e.err.Error() }
func (e *invalidConfig) Unwrap() error { return e.err }

func (s *secretSource) watch(ctx context.Context, last configUpdate, updates chan<- configUpdate) {
	ch := changes{last: last}
	onChange := func(obj any) {
		sec, ok := obj.(*corev1.Secret)
		if !ok {
			return
		}
		cfg, v, err := contract.ProxyConfigs.Decode(sec.Data)
		if u := newUpdate(cfg, v, err); ch.changed(u) {
			select {
			case updates <- u:
			case <-ctx.Done():
			}
		}
	}
	lw := cache.NewFilteredListWatchFromClient(s.client.CoreV1().RESTClient(), "secrets", s.namespace,
		func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", s.name).String()
		})
	_, informer := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &corev1.Secret{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    onChange,
			UpdateFunc: func(_, obj any) { onChange(obj) },
			DeleteFunc: func(any) {
				s.log.Warn("the config Secret was deleted; serving the last config", "secret", s.name)
			},
		},
	})
	informer.RunWithContext(ctx)
}

func newUpdate(cfg *contract.ProxyConfig, v int, err error) configUpdate {
	return configUpdate{cfg: cfg, version: v, err: err}
}

// dirSource reads the config from a directory, such as a mounted Secret, and polls it: the
// kubelet replaces a volume's files by swapping a symlink, which polling sees without
// watching the right inode.
type dirSource struct {
	dir      string
	interval time.Duration
}

func (d *dirSource) load(context.Context) (*contract.ProxyConfig, int, error) {
	cfg, v, err := contract.ProxyConfigs.DecodeDir(d.dir)
	if err != nil {
		// A directory is mounted whole before the proxy starts: what it lacks, it lacks.
		return nil, 0, &invalidConfig{fmt.Errorf("config directory %s: %w", d.dir, err)}
	}
	return cfg, v, nil
}

func (d *dirSource) watch(ctx context.Context, last configUpdate, updates chan<- configUpdate) {
	ch := changes{last: last}
	t := time.NewTicker(d.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if u := newUpdate(d.load(ctx)); ch.changed(u) {
			select {
			case updates <- u:
			case <-ctx.Done():
				return
			}
		}
	}
}
