"""The Hydra configuration of the harness's apps, shipped inside the package
(``pkg://harness.conf``); ``conf/`` at the top of a checkout links here."""
