"""Layer 4, inside the ranks of a script written for another library. Other libraries' names
mapped onto parsl-torch's, so their scripts run unchanged but for the import (``import parsl_torch.compat.ezpz as ezpz``)."""
