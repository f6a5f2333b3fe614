"""The trust layer the runtime applies around every step: the client gate and its floors,
the server gate's checks, robust aggregation, differential privacy and its accounting, the
client's ledger and noise, and secure sums. It imports the core and itself only."""
