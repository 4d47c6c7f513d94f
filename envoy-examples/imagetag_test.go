package examples

import (
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// sluiceImage is an image: line naming a sluice image.
var sluiceImage = regexp.MustCompile(`(?m)^\s*image:\s*(\S*sluice-rls/sluice\S*)\s*$`)

// TestImageTagsFollowTheRelease: the chart's appVersion is a release
// (X.Y.Z, never latest), its default image is that tag, and the Kubernetes and
// Istio examples run the same image. The release workflow packages the chart
// with the tag's version as appVersion and pushes the image under it.
func TestImageTagsFollowTheRelease(t *testing.T) {
	var chart struct {
		Version    string `yaml:"version"`
		AppVersion string `yaml:"appVersion"`
	}
	if err := yaml.Unmarshal([]byte(repoFile(t, "charts/sluice/Chart.yaml")), &chart); err != nil {
		t.Fatal(err)
	}
	release := regexp.MustCompile(`^\d+\.\d+\.\d+$`)
	if !release.MatchString(chart.AppVersion) {
		t.Errorf("Chart.yaml appVersion %q: want a release X.Y.Z (the image tag the chart defaults to)", chart.AppVersion)
	}
	var values struct {
		Image struct {
			Repository string `yaml:"repository"`
			Tag        string `yaml:"tag"`
		} `yaml:"image"`
	}
	if err := yaml.Unmarshal([]byte(repoFile(t, "charts/sluice/values.yaml")), &values); err != nil {
		t.Fatal(err)
	}
	if values.Image.Tag != "" {
		t.Errorf("values.yaml image.tag %q: leave it empty, the chart's appVersion is the tag", values.Image.Tag)
	}
	want := values.Image.Repository + ":" + chart.AppVersion
	for _, f := range []string{"envoy-examples/kubernetes/deployment.yaml", "envoy-examples/istio/sluice.yaml"} {
		images := sluiceImage.FindAllStringSubmatch(repoFile(t, f), -1)
		if len(images) == 0 {
			t.Errorf("%s: no sluice image", f)
		}
		for _, m := range images {
			if m[1] != want {
				t.Errorf("%s: image %s, want %s (the chart's)", f, m[1], want)
			}
		}
	}
	wf := repoFile(t, ".github/workflows/release.yml")
	for _, step := range []string{`--app-version "${VERSION}"`, "type=semver,pattern={{version}}", "latest=false", "cosign sign", "sbom: true"} {
		if !strings.Contains(wf, step) {
			t.Errorf("release.yml lacks %q", step)
		}
	}
}
