"""Joint models of rows and labels: FedGMM's joint model (FedEM, FedAvg, FedProx, Local as
configurations) and pFedEM."""
