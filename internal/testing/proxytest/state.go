package proxytest

import "github.com/tsingress/tsingress/internal/contract"

// AppliedState is what a standalone L3 proxy reports once it joined the tailnet as fqdn with
// ips and applied its DNAT rules (mappingErr: the error they failed with, "" when they hold).
func AppliedState(fqdn string, ips []string, mappingErr string) contract.ProxyState {
	return contract.ProxyState{
		DeviceID: "nNotARealDevice", FQDN: fqdn, TailnetIPs: ips,
		Firewall: &contract.FirewallStatus{Mode: contract.FirewallNFTables, Mappings: map[string]contract.AppliedDNAT{
			contract.StandaloneMapping: {TailnetIPs: ips, Error: mappingErr},
		}},
	}
}
