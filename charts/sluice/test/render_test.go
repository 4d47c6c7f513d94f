package charttest

import (
	"fmt"
	"path"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"sigs.k8s.io/yaml"
)

const (
	chartDir    = ".."
	releaseName = "sluice"
	namespace   = "rls"
)

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	return c
}

// render renders the chart with vals (YAML, over the chart's defaults) as
// `helm install sluice --namespace rls` would, and returns the manifests by
// template path, NOTES.txt left out.
func render(t *testing.T, vals string) (map[string]string, error) {
	t.Helper()
	c := loadChart(t)
	user, err := chartutil.ReadValues([]byte(vals))
	if err != nil {
		t.Fatalf("values: %v", err)
	}
	rv, err := chartutil.ToRenderValues(c, user, chartutil.ReleaseOptions{
		Name: releaseName, Namespace: namespace, Revision: 1, IsInstall: true,
	}, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	out, err := engine.Render(c, rv)
	if err != nil {
		return nil, err
	}
	for k := range out {
		if strings.HasSuffix(k, "NOTES.txt") {
			delete(out, k)
		}
	}
	return out, nil
}

func TestDump(t *testing.T) {
	out, err := render(t, "")
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]string, 0, len(out))
	for k := range out {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Printf("### %s\n%s\n", path.Base(k), out[k])
	}
	_ = yaml.Marshal
}
