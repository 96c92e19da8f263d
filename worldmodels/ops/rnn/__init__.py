"""GRU / LSTM sequence ops: `rnn(cell, x, states, weights, is_init, *, num_layers, bias, precision)`,
the signature every backend implements (see `reference.py`)."""
