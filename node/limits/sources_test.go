package limits

import "github.com/infermesh/infermesh/consensus"

// Fixed sources for tests; the node serves the replicated ones.

// StaticPrices is a fixed price table by model id.
type StaticPrices map[string]consensus.Price

// Price implements Prices.
func (p StaticPrices) Price(model string) (consensus.Price, bool) {
	pr, ok := p[model]
	return pr, ok
}

// PlanFunc adapts a function to PlanSource.
type PlanFunc func() PlanSettings

// PlanSettings implements PlanSource.
func (f PlanFunc) PlanSettings() PlanSettings { return f() }

// StaticPlan is a fixed PlanSource.
type StaticPlan PlanSettings

// PlanSettings implements PlanSource.
func (s StaticPlan) PlanSettings() PlanSettings { return PlanSettings(s) }

// String names the party in test failures.
func (p Party) String() string {
	if p == ThirdParty {
		return "third-party"
	}
	return "first-party"
}
