"""cua's computer-server protocol: ale's own client (``client``), the tunnel that
carries it into a sealed container (``tunnel``), and the sandbox over both
(``sandbox``)."""
