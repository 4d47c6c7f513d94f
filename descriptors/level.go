package descriptors

// Level is one level of a rule's path as written: its key and value and
// the options that apply to that level alone.
type Level struct {
	// Key is the descriptor key of the level.
	Key string
	// Value is the exact value or the wildcard pattern; "" when the level
	// matches any value.
	Value string
	// ValueToMetric is the level's value_to_metric.
	ValueToMetric bool
	// ShareThreshold is the level's share_threshold.
	ShareThreshold bool
}

// Level returns the i-th level of the rule's path (0 is the first below
// the domain); 0 ≤ i < Levels().
func (r *Rule) Level(i int) Level {
	l := r.levels[i]
	return Level{Key: l.key, Value: l.value, ValueToMetric: l.valueToMetric, ShareThreshold: l.share}
}
